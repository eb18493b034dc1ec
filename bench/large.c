/*
 * large: big blocks, where the allocator's dealings with the OS (mmap,
 * munmap, madvise, page faults) are the cost.
 *   min=256K max=32M  size range (uniform)
 *   live=1            blocks kept at once (a ring: each malloc frees the
 *                     oldest; filled before the clock starts)
 *   touch=1           write one byte per 4 KiB page of every block (0: only
 *                     the first byte) — an allocator that returns memory to
 *                     the OS at once pays a page fault per page again
 *   seconds=1
 * ops = allocations.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    size_t min = (size_t)bench_arg(argc, argv, "min", 256 * 1024);
    size_t max = (size_t)bench_arg(argc, argv, "max", 32 * 1024 * 1024);
    size_t live = (size_t)bench_arg(argc, argv, "live", 1);
    int touch = (int)bench_arg(argc, argv, "touch", 1);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    uint64_t rng = 7;
    char **ring = bench_check(calloc(live, sizeof *ring), "calloc");

    /* Each step frees the oldest block and allocates a new one; the first
       `live` steps (freeing nothing) fill the ring untimed, so that the
       figure is the steady state even when filling takes most of a short
       run (1000 blocks of 33..256 KiB: 0.4 s of page faults here). */
    double ops = 0, t0 = 0, t = 0;
    size_t k = 0;
    for (size_t step = 0;; step++) {
        if (step == live) {
            bench_cpu_mark();
            t0 = bench_now();
        }
        free(ring[k]);
        size_t size = bench_rand_range(&rng, min, max);
        char *p = bench_check(malloc(size), "malloc");
        if (touch)
            for (size_t off = 0; off < size; off += 4096)
                p[off] = (char)off;
        else
            p[0] = 1;
        bench_escape(p);
        ring[k] = p;
        k = (k + 1) % live;
        if (step < live)
            continue;
        ops++;
        if ((step & 7) == 7 && (t = bench_now() - t0) >= seconds)
            break;
    }

    for (size_t i = 0; i < live; i++)
        free(ring[i]);
    char extra[96];
    snprintf(extra, sizeof extra, " min=%zu max=%zu live=%zu touch=%d", min, max, live,
             touch);
    bench_result("large", extra, ops, t);
    return 0;
}
