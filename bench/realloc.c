/*
 * realloc: growing buffers, as a string builder or vector would.
 *   max=256K     final size of each buffer
 *   live=16      buffers grown side by side (so growth in place is not free)
 *   seconds=1
 * Each buffer starts at NULL and grows by 16 bytes up to 4 KiB, then by
 * 1/4 of its size up to max; the new last byte is written after each
 * call. ops = realloc calls.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    size_t max = (size_t)bench_arg(argc, argv, "max", 256 * 1024);
    size_t live = (size_t)bench_arg(argc, argv, "live", 16);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    char **buf = bench_check(calloc(live, sizeof *buf), "calloc");
    size_t *len = bench_check(calloc(live, sizeof *len), "calloc");

    double ops = 0, t0 = bench_now(), t;
    do {
        int growing = 1;
        while (growing) {
            growing = 0;
            for (size_t i = 0; i < live; i++) {
                if (len[i] >= max)
                    continue;
                size_t n = len[i] < 4096 ? len[i] + 16 : len[i] + len[i] / 4;
                if (n > max)
                    n = max;
                buf[i] = bench_check(realloc(buf[i], n), "realloc");
                buf[i][n - 1] = (char)n;
                len[i] = n;
                ops++;
                growing = 1;
            }
        }
        for (size_t i = 0; i < live; i++) {
            free(buf[i]);
            buf[i] = NULL;
            len[i] = 0;
        }
        t = bench_now() - t0;
    } while (t < seconds);

    char extra[64];
    snprintf(extra, sizeof extra, " max=%zu live=%zu", max, live);
    bench_result("realloc", extra, ops, t);
    return 0;
}
