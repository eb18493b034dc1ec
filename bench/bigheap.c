/*
 * bigheap: a heap of many GiB, built and torn down as a database, a cache
 * or a compiler does.
 *   gib=4        bytes allocated in all, in GiB (fractions allowed)
 *   size=1024    block size
 *   random=1     free in a random order (0: in allocation order)
 * Phases: (1) allocate the blocks, first byte of each written; (2) free
 * them all (the order is drawn before the clock starts); (3) allocate half
 * as many again, written, and free them. What it shows is how the
 * allocator's own bookkeeping scales with the heap: every phase does the
 * same work per block whatever the heap's size, so an allocator whose
 * cost per block grows with it shows up as a phase that grows faster than
 * `gib`. ops = mallocs and frees of all phases; secs = their time.
 * Reports grow_s, free_s and again_s, the three phases' times.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    double gib = bench_arg(argc, argv, "gib", 4);
    size_t size = (size_t)bench_arg(argc, argv, "size", 1024);
    int random = (int)bench_arg(argc, argv, "random", 1);
    size_t n = (size_t)(gib * (double)(1ull << 30)) / size;
    void **blocks = bench_check(calloc(n, sizeof *blocks), "calloc");
    size_t *order = bench_check(calloc(n, sizeof *order), "calloc");
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    uint64_t rng = 2026;
    for (size_t i = n - 1; random && i > 0; i--) {
        size_t j = (size_t)(bench_rand(&rng) % (i + 1)), x = order[i];
        order[i] = order[j];
        order[j] = x;
    }

    bench_cpu_mark();
    double t0 = bench_now();
    for (size_t i = 0; i < n; i++) {
        char *p = bench_check(malloc(size), "malloc");
        p[0] = 1;
        blocks[i] = p;
    }
    double t1 = bench_now();
    for (size_t i = 0; i < n; i++)
        free(blocks[order[i]]);
    double t2 = bench_now();
    for (size_t i = 0; i < n / 2; i++) {
        char *p = bench_check(malloc(size), "malloc");
        p[0] = 1;
        blocks[i] = p;
    }
    for (size_t i = 0; i < n / 2; i++)
        free(blocks[i]);
    double t3 = bench_now();

    char extra[160];
    snprintf(extra, sizeof extra,
             " gib=%g size=%zu random=%d grow_s=%.3f free_s=%.3f again_s=%.3f", gib, size,
             random, t1 - t0, t2 - t1, t3 - t2);
    bench_result("bigheap", extra, (double)n * 3, t3 - t0);
    free(order);
    free(blocks);
    return 0;
}
