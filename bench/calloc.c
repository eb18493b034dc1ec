/*
 * calloc: zeroed buffers that are mostly left untouched, as a program
 * allocates arrays, tables or structs with room to spare.
 *   size=64K   bytes per block
 *   live=3200  blocks held at once (200 MiB at the default size)
 *   seconds=1
 * Each round callocs `live` blocks, writes one byte in the middle of each,
 * then frees them all. ops = calloc calls. An allocator that knows a block
 * is zero already (fresh from the OS) need not clear it, and its pages stay
 * untouched until the program writes them.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    size_t size = (size_t)bench_arg(argc, argv, "size", 64 * 1024);
    size_t live = (size_t)bench_arg(argc, argv, "live", 3200);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    if (size < 1 || live < 1) {
        fprintf(stderr, "calloc: size and live must be positive\n");
        return 2;
    }
    char **buf = bench_check(malloc(live * sizeof *buf), "malloc");

    double ops = 0, t0 = bench_now(), t;
    do {
        for (size_t i = 0; i < live; i++) {
            buf[i] = bench_check(calloc(1, size), "calloc");
            if (buf[i][size / 2])
                bench_check(NULL, "calloc: a block is not zero");
            buf[i][size / 2] = 1;
        }
        for (size_t i = 0; i < live; i++)
            free(buf[i]);
        ops += (double)live;
        t = bench_now() - t0;
    } while (t < seconds);

    char extra[64];
    snprintf(extra, sizeof extra, " size=%zu live=%zu", size, live);
    bench_result("calloc", extra, ops, t);
    free(buf);
    return 0;
}
