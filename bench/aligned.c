/*
 * aligned: posix_memalign and aligned_alloc with alignments 16 .. maxalign.
 *   maxalign=4096  largest alignment drawn (powers of two from 16)
 *   batch=1000     objects live at once, freed in allocation order
 *   seconds=1
 * Sizes 16..2048, alternately from posix_memalign and aligned_alloc (size
 * rounded up to the alignment, as C11 asked before DR 460). Every pointer
 * is checked: misaligned=<n> counts the pointers that were not aligned as
 * asked (a bug in the allocator; bench/run reports it). Debian's mimalloc
 * 2.0.9 does this when size == alignment in 256..1024 (mimalloc issue 700).
 * ops = allocations (each also freed).
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    size_t maxalign = (size_t)bench_arg(argc, argv, "maxalign", 4096);
    size_t batch = (size_t)bench_arg(argc, argv, "batch", 1000);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    uint64_t rng = 42;
    int nalign = 0;
    while (((size_t)16 << nalign) <= maxalign)
        nalign++;
    void **slot = bench_check(malloc(batch * sizeof *slot), "malloc");

    long misaligned = 0;
    double ops = 0, t0 = bench_now(), t;
    do {
        for (size_t i = 0; i < batch; i++) {
            size_t align = (size_t)16 << (bench_rand(&rng) % (uint64_t)nalign);
            size_t size = bench_rand_range(&rng, 16, 2048);
            void *p;
            if (i & 1) {
                p = aligned_alloc(align, (size + align - 1) & ~(align - 1));
            } else if (posix_memalign(&p, align, size) != 0) {
                p = NULL;
            }
            bench_check(p, "aligned allocation");
            misaligned += ((uintptr_t)p & (align - 1)) != 0;
            *(char *)p = 1;
            slot[i] = p;
        }
        for (size_t i = 0; i < batch; i++)
            free(slot[i]);
        ops += (double)batch;
        t = bench_now() - t0;
    } while (t < seconds);

    char extra[96];
    snprintf(extra, sizeof extra, " maxalign=%zu batch=%zu misaligned=%ld", maxalign, batch,
             misaligned);
    bench_result("aligned", extra, ops, t);
    return 0;
}
