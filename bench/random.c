/*
 * random: random sizes, random free order, in batches.
 *   batch=10000  objects allocated, then freed in a random order
 *   large=5      percent of sizes above 1 KiB
 *   seconds=1
 * Sizes: 95% uniform in 16..1024, 5% uniform in 1025..32K (large=100: all
 * in 1025..32K, 170 MB of blocks a batch: a program that frees a large
 * heap and allocates it again at once). Each object's
 * first word is written (as a program would). Size tables and free orders
 * are drawn before the clock starts (8 of each, used in turn), so the
 * timed loop is malloc/free and a store. ops = malloc+free pairs.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

#define NTABLES 8

int main(int argc, char **argv)
{
    size_t batch = (size_t)bench_arg(argc, argv, "batch", 10000);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    uint64_t large = (uint64_t)bench_arg(argc, argv, "large", 5);
    uint64_t rng = 0x9e3779b97f4a7c15ULL;

    size_t *sizes[NTABLES];
    size_t *order[NTABLES];
    for (int t = 0; t < NTABLES; t++) {
        sizes[t] = bench_check(malloc(batch * sizeof(size_t)), "malloc");
        order[t] = bench_check(malloc(batch * sizeof(size_t)), "malloc");
        for (size_t i = 0; i < batch; i++) {
            sizes[t][i] = bench_rand(&rng) % 100 < 100 - large
                              ? bench_rand_range(&rng, 16, 1024)
                              : bench_rand_range(&rng, 1025, 32768);
            order[t][i] = i;
        }
        for (size_t i = batch - 1; i > 0; i--) { /* Fisher-Yates */
            size_t j = (size_t)(bench_rand(&rng) % (i + 1)), x = order[t][i];
            order[t][i] = order[t][j];
            order[t][j] = x;
        }
    }
    void **slot = bench_check(malloc(batch * sizeof(void *)), "malloc");

    double ops = 0, t0 = bench_now(), t;
    int tab = 0;
    do {
        const size_t *sz = sizes[tab], *ord = order[tab];
        for (size_t i = 0; i < batch; i++) {
            size_t *p = malloc(sz[i]);
            *p = i;
            slot[i] = p;
        }
        for (size_t i = 0; i < batch; i++)
            free(slot[ord[i]]);
        ops += (double)batch;
        tab = (tab + 1) % NTABLES;
        t = bench_now() - t0;
    } while (t < seconds);

    char extra[64];
    snprintf(extra, sizeof extra, " batch=%zu large=%u", batch, (unsigned)large);
    bench_result("random", extra, ops, t);
    return 0;
}
