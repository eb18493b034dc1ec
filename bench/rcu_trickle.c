/*
 * rcu_trickle: background wakeups caused by a trickle of deferred callbacks,
 * graceslab (gs_call_rcu) vs liburcu-memb (urcu_memb_call_rcu), one after
 * the other in one run. Counts voluntary + involuntary context switches in
 * /proc/self/task/<tid>/status of every thread but the main one, split into
 * graceslab's lazy thread ("gs-rcu-lazy") and the others (liburcu's
 * call_rcu thread). Then a trickle of gs_malloc + gs_free_rcu (the
 * allocator's deferred free, reclaimed by its own slow paths and the lazy
 * sweep), then `idle` seconds with nothing pending.
 * Args: rate=N (callbacks/s) seconds=N idle=N.
 */
#include "graceslab.h"
#include "rcu_bench.h"

#include <dirent.h>
#include <stdatomic.h>
#include <unistd.h>
#include <urcu/urcu-memb.h>

/* Context switches of the non-main threads: [0] gs-rcu-lazy, [1] others. */
static void switches(long out[2])
{
    out[0] = out[1] = 0;
    pid_t self = getpid();
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.' || atoi(e->d_name) == self)
            continue;
        char path[300], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        int k = 1;
        while (f && fgets(line, sizeof line, f)) {
            long v;
            if (strcmp(line, "Name:\tgs-rcu-lazy\n") == 0)
                k = 0;
            if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1 ||
                sscanf(line, "nonvoluntary_ctxt_switches: %ld", &v) == 1)
                out[k] += v;
        }
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
}

static atomic_long done_gs, done_urcu;
static void gs_cb(struct gs_rcu_head *h)
{
    (void)h;
    atomic_fetch_add(&done_gs, 1);
}
static void urcu_cb(struct rcu_head *h)
{
    (void)h;
    atomic_fetch_add(&done_urcu, 1);
}

static void pace(double t0, long i, double rate)
{
    double due = t0 + (double)i / rate, now = rb_now();
    if (due > now)
        usleep((useconds_t)((due - now) * 1e6));
}

int main(int argc, char **argv)
{
    double rate = rb_arg(argc, argv, "rate", 100), secs = rb_arg(argc, argv, "seconds", 5);
    double idle = rb_arg(argc, argv, "idle", 3);
    long n = (long)(rate * secs);
    struct gs_rcu_head *gh = calloc((size_t)n, sizeof *gh);
    struct rcu_head *uh = calloc((size_t)n, sizeof *uh);
    long s0[2], s1[2], s2[2], s3[2], s4[2];

    switches(s0);
    double t0 = rb_now();
    for (long i = 0; i < n; i++) {
        gs_call_rcu(&gh[i], gs_cb);
        pace(t0, i + 1, rate);
    }
    switches(s1);
    double gs_rate = (double)(s1[0] - s0[0]) / secs;

    urcu_memb_register_thread();
    t0 = rb_now();
    for (long i = 0; i < n; i++) {
        urcu_memb_call_rcu(&uh[i], urcu_cb);
        pace(t0, i + 1, rate);
    }
    switches(s2);
    double urcu_rate = (double)(s2[1] - s1[1]) / secs;

    /* gs_free_rcu trickle: one allocation and one deferred free per step. */
    t0 = rb_now();
    for (long i = 0; i < n; i++) {
        void *p = gs_malloc(64);
        gs_free_rcu(p);
        pace(t0, i + 1, rate);
    }
    long s2b[2];
    switches(s2b);
    double free_rcu_rate = (double)(s2b[0] - s2[0]) / secs;
    struct gs_stats st;
    gs_stats_get(&st);
    size_t trickle_pending = st.pending_objects;

    /* Idle: let graceslab's lazy thread finish its batch and linger, and
       liburcu's thread drain, then count. */
    usleep(2500000);
    switches(s3);
    usleep((useconds_t)(idle * 1e6));
    switches(s4);

    printf("rcu_trickle: %.0f call_rcu/s for %.0f s, then %.0f s idle\n", rate, secs, idle);
    printf("  graceslab lazy thread  %7.2f wakeups/s   idle: %ld\n", gs_rate, s4[0] - s3[0]);
    printf("  liburcu call_rcu thr.  %7.2f wakeups/s   idle: %ld\n", urcu_rate, s4[1] - s3[1]);
    printf("  gs_free_rcu trickle    %7.2f wakeups/s   (pending at its end: %zu objects)\n",
           free_rcu_rate, trickle_pending);
    printf("  callbacks run: gs %ld, urcu %ld\n", (long)atomic_load(&done_gs),
           (long)atomic_load(&done_urcu));
    printf("RESULT rcu_trickle gs_wakeups_per_s=%.2f urcu_wakeups_per_s=%.2f "
           "free_rcu_wakeups_per_s=%.2f gs_idle=%ld urcu_idle=%ld\n",
           gs_rate, urcu_rate, free_rcu_rate, s4[0] - s3[0], s4[1] - s3[1]);
    gs_rcu_barrier();
    urcu_memb_barrier();
    urcu_memb_unregister_thread();
    return 0;
}
