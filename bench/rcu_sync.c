/*
 * rcu_sync: latency of a synchronous grace period with one reader thread
 * spinning on lock+unlock, graceslab (gs_synchronize_rcu) vs liburcu-memb
 * (urcu_memb_synchronize_rcu), interleaved in one run. Median and p90 of
 * `count` calls per round, `rounds` rounds. Args: count=N rounds=N.
 */
#include "graceslab.h"
#include "rcu_bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <urcu/urcu-memb.h>

static atomic_int which; /* 0 stop, 1 gs reader, 2 urcu reader */
static atomic_int quit;

static void *spinner(void *arg)
{
    (void)arg;
    urcu_memb_register_thread();
    while (!atomic_load_explicit(&quit, memory_order_relaxed)) {
        int w = atomic_load_explicit(&which, memory_order_relaxed);
        if (w == 1) {
            for (int i = 0; i < 1000; i++) {
                gs_rcu_read_lock();
                gs_rcu_read_unlock();
            }
        } else if (w == 2) {
            for (int i = 0; i < 1000; i++) {
                urcu_memb_read_lock();
                urcu_memb_read_unlock();
            }
        }
    }
    urcu_memb_unregister_thread();
    return NULL;
}

static void measure(int w, int count, double *out)
{
    atomic_store(&which, w);
    for (int i = 0; i < count; i++) {
        double t0 = rb_now();
        if (w == 1)
            gs_synchronize_rcu();
        else
            urcu_memb_synchronize_rcu();
        out[i] = (rb_now() - t0) * 1e6;
    }
    atomic_store(&which, 0);
}

int main(int argc, char **argv)
{
    int count = (int)rb_arg(argc, argv, "count", 2000);
    int rounds = (int)rb_arg(argc, argv, "rounds", 5);
    double *g = malloc(sizeof(double) * (size_t)count * (size_t)rounds);
    double *u = malloc(sizeof(double) * (size_t)count * (size_t)rounds);
    pthread_t t;
    urcu_memb_register_thread();
    pthread_create(&t, NULL, spinner, NULL);
    for (int r = 0; r < rounds; r++) {
        measure(1, count, g + (size_t)r * (size_t)count);
        measure(2, count, u + (size_t)r * (size_t)count);
    }
    atomic_store(&quit, 1);
    pthread_join(t, NULL);
    int n = count * rounds;
    double mg = rb_median(g, n), mu = rb_median(u, n);
    printf("rcu_sync: synchronize with one reader spinning, %d calls\n", n);
    printf("  graceslab     median %7.2f us  p90 %7.2f us\n", mg, g[n * 9 / 10]);
    printf("  liburcu-memb  median %7.2f us  p90 %7.2f us\n", mu, u[n * 9 / 10]);
    printf("  ratio gs/urcu %.2f\n", mg / mu);
    printf("RESULT rcu_sync gs_us=%.2f urcu_us=%.2f\n", mg, mu);
    urcu_memb_unregister_thread();
    free(g);
    free(u);
    return 0;
}
