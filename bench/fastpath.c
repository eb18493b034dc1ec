/*
 * fastpath: single-thread malloc/free of one fixed size.
 *   size=64      object size in bytes (16 .. 32K)
 *   batch=1      objects live at once: malloc batch, then free them in order
 *   seconds=1    run time
 * ops = malloc+free pairs.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    size_t size = (size_t)bench_arg(argc, argv, "size", 64);
    size_t batch = (size_t)bench_arg(argc, argv, "batch", 1);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    void **slot = bench_check(malloc(batch * sizeof *slot), "malloc");

    double ops = 0, t0 = bench_now(), t;
    do {
        for (int round = 0; round < 1024; round++) {
            for (size_t i = 0; i < batch; i++) {
                void *p = malloc(size);
                bench_escape(p);
                slot[i] = p;
            }
            for (size_t i = 0; i < batch; i++)
                free(slot[i]);
        }
        ops += 1024.0 * (double)batch;
        t = bench_now() - t0;
    } while (t < seconds);

    free(slot);
    char extra[64];
    snprintf(extra, sizeof extra, " size=%zu batch=%zu", size, batch);
    bench_result("fastpath", extra, ops, t);
    return 0;
}
