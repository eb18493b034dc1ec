/*
 * threadexit: threads that end while their slabs still hold free blocks.
 *   threads=2000  phase 1: threads started one after another, each joined
 *                 before the next starts
 *   blocks=16     blocks each of them allocates (min..max bytes, every page
 *                 written); it frees all but `keep`, which it hands to the
 *                 main thread, freed there 8 threads later
 *   keep=4
 *   min=40000 max=200000
 *   big=2000      phase 2: one thread allocates `big` blocks of min..max,
 *                 writes them, frees 3 in 4 at random, and exits
 * ops = phase 1's threads, secs = phase 1's time (a thread's start and join
 * included: what a thread-per-request program pays). Beside the usual
 * fields:
 *   rss_exit_kb   RSS - start after phase 2's thread is joined
 *   live_exit_kb  bytes it left live
 * The two sides of what an exiting thread should do with the free blocks
 * in its slabs: keep them for the next thread (phase 1), and not keep
 * hundreds of MB of them for nobody (phase 2).
 */
#include "common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct args {
    size_t blocks, keep, min, max;
    uint64_t seed;
    void **handed; /* keep entries */
    size_t live;   /* phase 2: bytes left live */
};

static void *short_thread(void *arg)
{
    struct args *a = arg;
    for (size_t i = 0; i < a->blocks; i++) {
        size_t n = bench_rand_range(&a->seed, a->min, a->max);
        char *p = bench_check(malloc(n), "malloc");
        memset(p, (int)i, n);
        if (i < a->keep)
            a->handed[i] = p;
        else
            free(p);
    }
    return NULL;
}

static void *big_thread(void *arg)
{
    struct args *a = arg;
    void **p = bench_check(malloc(a->blocks * sizeof *p), "malloc");
    size_t *size = bench_check(malloc(a->blocks * sizeof *size), "malloc");
    for (size_t i = 0; i < a->blocks; i++) {
        size[i] = bench_rand_range(&a->seed, a->min, a->max);
        p[i] = bench_check(malloc(size[i]), "malloc");
        memset(p[i], 1, size[i]);
    }
    a->live = 0;
    for (size_t i = 0; i < a->blocks; i++) {
        if (bench_rand(&a->seed) % 4)
            free(p[i]);
        else
            a->live += size[i]; /* left live for good, as a cache would */
    }
    free(size);
    free(p);
    return NULL;
}

static void run(void *(*fn)(void *), struct args *a)
{
    pthread_t t;
    if (pthread_create(&t, NULL, fn, a) || pthread_join(t, NULL)) {
        fprintf(stderr, "threadexit: pthread_create/join failed\n");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    size_t threads = (size_t)bench_arg(argc, argv, "threads", 2000);
    size_t keep = (size_t)bench_arg(argc, argv, "keep", 4);
    struct args a = {
        .blocks = (size_t)bench_arg(argc, argv, "blocks", 16),
        .keep = keep,
        .min = (size_t)bench_arg(argc, argv, "min", 40000),
        .max = (size_t)bench_arg(argc, argv, "max", 200000),
        .seed = 7,
    };
    size_t big = (size_t)bench_arg(argc, argv, "big", 2000);
    if (a.min < 1 || a.max < a.min || keep > a.blocks) {
        fprintf(stderr, "threadexit: need 1 <= min <= max and keep <= blocks\n");
        return 2;
    }
    enum { LAG = 8 };
    void **handed = bench_check(calloc(LAG * (keep + 1), sizeof *handed), "calloc");

    long base = bench_rss_kb();
    bench_cpu_mark();
    double t0 = bench_now();
    for (size_t i = 0; i < threads; i++) {
        void **mine = handed + (i % LAG) * keep;
        for (size_t k = 0; k < keep; k++)
            free(mine[k]); /* handed over LAG threads ago (or NULL) */
        a.handed = mine;
        run(short_thread, &a);
    }
    double secs = bench_now() - t0;
    for (size_t i = 0; i < LAG * keep; i++) {
        free(handed[i]);
        handed[i] = NULL;
    }

    struct args b = a;
    b.blocks = big;
    b.seed = 11;
    long before = bench_rss_kb();
    run(big_thread, &b);
    long after = bench_rss_kb();

    char extra[160];
    snprintf(extra, sizeof extra,
             " threads=%zu blocks=%zu keep=%zu min=%zu max=%zu big=%zu rss_exit_kb=%ld"
             " live_exit_kb=%zu rss_before_kb=%ld",
             threads, a.blocks, keep, a.min, a.max, big, after - base, b.live / 1024,
             before - base);
    bench_result("threadexit", extra, (double)threads, secs);
    return 0;
}
