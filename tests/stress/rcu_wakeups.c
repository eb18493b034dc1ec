/*
 * rcu_wakeups: laziness of the engine, counted two ways — the lazy thread's
 * own wakeup counter (gsi_rcu_lazy_wakeups) and the context switches of
 * the thread named "gs-rcu-lazy" in /proc/self/task/<tid>/status (only that
 * one: sanitizer runtimes have background threads of their own).
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

/* Context switches of the engine's lazy thread (0 if it does not exist). */
static long background_switches(void)
{
    long total = 0;
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
        while (f && fgets(line, sizeof line, f)) {
            long v;
            if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1 ||
                sscanf(line, "nonvoluntary_ctxt_switches: %ld", &v) == 1)
                total += v;
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

    /* 2. Trickle. */
    static struct gs_rcu_head heads[TRICKLE_S * RATE];
    long sw0 = background_switches();
    uint64_t w0 = gsi_rcu_lazy_wakeups();
    for (int i = 0; i < TRICKLE_S * RATE; i++) {
        gs_call_rcu(&heads[i], cb);
        sleep_ns(1000000000L / RATE);
    }
    uint64_t w1 = gsi_rcu_lazy_wakeups();
    long sw1 = background_switches();
    double per_s_counter = (double)(w1 - w0) / TRICKLE_S;
    double per_s_proc = (double)(sw1 - sw0) / TRICKLE_S;
    printf("rcu_wakeups: trickle %d call_rcu/s for %ds (lazy %ld ms): %.2f wakeups/s (counter), "
           "%.2f context switches/s (/proc), %ld callbacks run\n",
           RATE, TRICKLE_S, lazy_ms, per_s_counter, per_s_proc, (long)atomic_load(&ran));
    /* One wakeup per lazy timeout, plus the first one that arms the timer. */
    double bound = 1000.0 / (double)lazy_ms + 1.0 / TRICKLE_S + 0.01;
    CHECK(per_s_counter <= bound, "%.2f wakeups/s > %.2f", per_s_counter, bound);
    CHECK(per_s_proc <= bound + 1.0 / TRICKLE_S, "%.2f context switches/s > %.2f", per_s_proc,
          bound + 1.0 / TRICKLE_S);
    CHECK(atomic_load(&ran) > 0, "no lazy callback ran during the trickle");

    /* 3. Idle: the last lazy batch runs within one lazy timeout, the thread
       lingers one more; after that, nothing wakes it. */
    sleep_ns((2 * lazy_ms + 300) * 1000000L);
    w1 = gsi_rcu_lazy_wakeups();
    sw1 = background_switches();
    sleep_ns(IDLE_S * 1000000000L);
    uint64_t w2 = gsi_rcu_lazy_wakeups();
    long sw2 = background_switches();
    printf("rcu_wakeups: idle %ds: %llu wakeups (counter), %ld context switches (/proc)\n", IDLE_S,
           (unsigned long long)(w2 - w1), sw2 - sw1);
    CHECK(w2 == w1, "%llu wakeups while idle", (unsigned long long)(w2 - w1));
    CHECK(sw2 == sw1, "%ld background context switches while idle", sw2 - sw1);
    CHECK(atomic_load(&ran) == TRICKLE_S * RATE, "%ld of %d lazy callbacks ran after the timeout",
          (long)atomic_load(&ran), TRICKLE_S * RATE);

    gs_rcu_barrier();
    return failures ? 1 : 0;
}
