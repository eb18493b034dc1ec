/*
 * rcu_wakeups: laziness of the engine, counted two ways — the lazy thread's
 * own wakeup counter (gsi_rcu_lazy_wakeups) and the context switches of
 * the thread named "gs-rcu-lazy" in /proc/self/task/<tid>/status (only that
 * one: sanitizer runtimes have background threads of their own). Every
 * wakeup ends in one voluntary switch (the thread blocks again), so the
 * rate bound is on voluntary switches; involuntary ones are preemptions of
 * a thread already awake, as many as the machine's load makes (a loaded
 * 2-core machine under TSan gave 2 for 4 wakeups in 3 s). While idle the
 * thread must not run at all, so there both kinds count, and so does its
 * CPU time (a thread spinning on an idle core switches not at all).
 *
 *   1. Nothing deferred: reads, gs_synchronize_rcu, polling and an empty
 *      gs_rcu_barrier create no thread.
 *   2. A trickle of 100 gs_call_rcu()/s for TRICKLE_S seconds wakes the
 *      background thread at most about once per lazy timeout (default 1 s).
 *   3. After the trickle stops and the thread's linger period passed: zero
 *      wakeups during IDLE_S seconds.
 * Run with the default GRACESLAB_RCU_LAZY_MS (1000). Exit status 0 = pass.
 */
#include "graceslab.h"
#include "alloc/common.h"
#include "rcu/engine.h"
#include "rcu/internal.h"

#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TRICKLE_S 3
#define IDLE_S 2
#define RATE 100

static int failures;
#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "rcu_wakeups: FAIL: " __VA_ARGS__);                \
            fputc('\n', stderr);                                               \
            failures++;                                                        \
        }                                                                      \
    } while (0)

struct switches {
    long voluntary, involuntary;
    long cpu_ticks; /* user + system time, in clock ticks (/proc/.../stat) */
};

/* Fields 14 and 15 (utime, stime) of /proc/self/task/<tid>/stat; the
   command name (field 2) is in parentheses and may hold spaces. */
static long task_cpu_ticks(const char *tid)
{
    char path[300], buf[1024];
    snprintf(path, sizeof path, "/proc/self/task/%s/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *s = strrchr(buf, ')');
    long utime = 0, stime = 0;
    if (s && sscanf(s + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &utime,
                    &stime) == 2)
        return utime + stime;
    return 0;
}

/* Context switches of the engine's lazy thread (0 if it does not exist). */
static struct switches background_switches(void)
{
    struct switches total = {0, 0, 0};
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        if (f && (!fgets(line, sizeof line, f) || strcmp(line, "Name:\tgs-rcu-lazy\n") != 0)) {
            fclose(f);
            continue;
        }
        if (f)
            total.cpu_ticks += task_cpu_ticks(e->d_name);
        while (f && fgets(line, sizeof line, f)) {
            long v;
            if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1)
                total.voluntary += v;
            else if (sscanf(line, "nonvoluntary_ctxt_switches: %ld", &v) == 1)
                total.involuntary += v;
        }
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return total;
}

static int task_count(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static atomic_long ran;
static void cb(struct gs_rcu_head *h)
{
    (void)h;
    atomic_fetch_add(&ran, 1);
}

static double elapsed_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static void sleep_ns(long ns)
{
    struct timespec t = {ns / 1000000000L, ns % 1000000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

int main(void)
{
    long lazy_ms = gsi_option(GSI_OPT_RCU_LAZY_MS);
    int tasks0 = task_count();

    /* 1. No deferral, no thread. */
    for (int i = 0; i < 1000; i++) {
        gs_rcu_read_lock();
        gs_rcu_read_unlock();
    }
    gs_synchronize_rcu();
    unsigned long c = gs_rcu_get_state();
    while (!gs_rcu_poll_state(c))
        ;
    gs_rcu_barrier();
    CHECK(!gsi_rcu_lazy_thread_exists(), "a thread exists although nothing was deferred");
    CHECK(task_count() == tasks0, "task count grew from %d to %d without a deferral", tasks0,
          task_count());

    /* 2. Trickle, paced by absolute deadlines (so that it lasts TRICKLE_S
       unless the machine cannot keep up). The bound is on the time it did
       last: a loaded machine stretched it to 6.5 s once, and a bound on the
       nominal 3 s then counted the thread's timer wakeups of the extra
       seconds against it. */
    static struct gs_rcu_head heads[TRICKLE_S * RATE];
    struct switches sw0 = background_switches();
    uint64_t w0 = gsi_rcu_lazy_wakeups();
    struct timespec start, next;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int i = 0; i < TRICKLE_S * RATE; i++) {
        gs_call_rcu(&heads[i], cb);
        long at = (long)(i + 1) * (1000000000L / RATE);
        next.tv_sec = start.tv_sec + (start.tv_nsec + at) / 1000000000L;
        next.tv_nsec = (start.tv_nsec + at) % 1000000000L;
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) != 0)
            ;
    }
    uint64_t w1 = gsi_rcu_lazy_wakeups();
    struct switches sw1 = background_switches();
    double elapsed_s = elapsed_since(&start);
    long wakeups = (long)(w1 - w0), voluntary = sw1.voluntary - sw0.voluntary;
    printf("rcu_wakeups: trickle %d call_rcu/s for %.2fs (lazy %ld ms): %ld wakeups (counter), "
           "%ld voluntary context switches (/proc; %ld involuntary), %ld callbacks run\n",
           RATE, elapsed_s, lazy_ms, wakeups, voluntary, sw1.involuntary - sw0.involuntary,
           (long)atomic_load(&ran));
    /* One wakeup per lazy timeout, plus the first one that arms the timer;
       one voluntary switch more (the thread's first sleep). */
    double bound = elapsed_s * 1000.0 / (double)lazy_ms + 1.0 + 0.03;
    CHECK(wakeups <= bound, "%ld wakeups in %.2f s > %.2f", wakeups, elapsed_s, bound);
    CHECK(voluntary <= bound + 1.0, "%ld voluntary context switches in %.2f s > %.2f", voluntary,
          elapsed_s, bound + 1.0);
    CHECK(atomic_load(&ran) > 0, "no lazy callback ran during the trickle");

    /* 3. Idle: the last lazy batch runs within one lazy timeout, the thread
       lingers one more; after that, nothing wakes it. */
    sleep_ns((2 * lazy_ms + 300) * 1000000L);
    w1 = gsi_rcu_lazy_wakeups();
    sw1 = background_switches();
    sleep_ns(IDLE_S * 1000000000L);
    uint64_t w2 = gsi_rcu_lazy_wakeups();
    struct switches sw2 = background_switches();
    long idle_switches = (sw2.voluntary - sw1.voluntary) + (sw2.involuntary - sw1.involuntary);
    long idle_ticks = sw2.cpu_ticks - sw1.cpu_ticks;
    printf("rcu_wakeups: idle %ds: %llu wakeups (counter), %ld context switches, %ld CPU ticks "
           "(/proc)\n", IDLE_S, (unsigned long long)(w2 - w1), idle_switches, idle_ticks);
    CHECK(w2 == w1, "%llu wakeups while idle", (unsigned long long)(w2 - w1));
    CHECK(idle_switches == 0, "%ld background context switches while idle", idle_switches);
    /* A thread that spins without blocking makes no voluntary switch, and
       on an idle core no involuntary one either: its CPU time shows it. */
    CHECK(idle_ticks == 0, "the background thread ran for %ld clock ticks while idle", idle_ticks);
    CHECK(atomic_load(&ran) == TRICKLE_S * RATE, "%ld of %d lazy callbacks ran after the timeout",
          (long)atomic_load(&ran), TRICKLE_S * RATE);

    gs_rcu_barrier();
    return failures ? 1 : 0;
}
