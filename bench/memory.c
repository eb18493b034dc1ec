/*
 * memory: fragmentation and how fast memory goes back to the OS.
 *   count=200000  blocks in the first set (16..1024 bytes, fully written)
 *   keep=25       percent of the first set kept after a random partial free
 *   wait_ms=1000  how long to watch RSS after freeing everything
 * Phases: (1) allocate the first set; (2) free a random (100-keep)% of it
 * and allocate the same number of bytes again in blocks of 1025..4096
 * bytes, which cannot reuse the small holes; (3) free everything and read
 * /proc/self/statm every 10 ms for wait_ms, with one malloc(64)/free each
 * millisecond (a program that still does a little work: allocators that
 * purge lazily get the chance to run their purging).
 * Reports, beside the usual fields:
 *   live_peak_kb   most bytes live at once (as requested)
 *   rss_grow_kb    peak RSS (statm, before the final free) - RSS at start
 *   frag_ratio     rss_grow_kb / live_peak_kb (1.0 = no overhead)
 *   rss_free0_kb   RSS - start just after freeing everything
 *   rss_end_kb     RSS - start after wait_ms
 *   release_ms     first reading where RSS - start <= 10% of rss_grow_kb
 *                  (-1: not within wait_ms)
 * and TRACE ms=<t> rss_kb=<RSS - start> lines for plotting.
 * ops = allocations in phases 1-2; secs = their time.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SAMPLES 2048

int main(int argc, char **argv)
{
    size_t count = (size_t)bench_arg(argc, argv, "count", 200000);
    int keep = (int)bench_arg(argc, argv, "keep", 25);
    long wait_ms = (long)bench_arg(argc, argv, "wait_ms", 1000);
    uint64_t rng = 99;
    static long trace_ms[MAX_SAMPLES], trace_kb[MAX_SAMPLES];

    void **small = bench_check(calloc(count, sizeof *small), "calloc");
    size_t *small_size = bench_check(calloc(count, sizeof *small_size), "calloc");
    void **big = bench_check(calloc(count, sizeof *big), "calloc");
    long base = bench_rss_kb();

    double t0 = bench_now(), ops = 0;
    size_t live = 0, live_peak = 0;
    for (size_t i = 0; i < count; i++) {
        small_size[i] = bench_rand_range(&rng, 16, 1024);
        small[i] = bench_check(malloc(small_size[i]), "malloc");
        memset(small[i], 1, small_size[i]);
        live += small_size[i];
        ops++;
    }
    live_peak = live;
    size_t freed = 0;
    for (size_t i = 0; i < count; i++)
        if (bench_rand(&rng) % 100 >= (uint64_t)keep) {
            freed += small_size[i];
            free(small[i]);
            small[i] = NULL;
        }
    live -= freed;
    size_t nbig = 0;
    while (freed > 0 && nbig < count) {
        size_t s = bench_rand_range(&rng, 1025, 4096);
        big[nbig] = bench_check(malloc(s), "malloc");
        memset(big[nbig++], 2, s);
        live += s;
        freed = freed > s ? freed - s : 0;
        ops++;
    }
    if (live > live_peak)
        live_peak = live;
    double secs = bench_now() - t0;
    long grow = bench_rss_kb() - base;

    for (size_t i = 0; i < count; i++)
        free(small[i]);
    for (size_t i = 0; i < nbig; i++)
        free(big[i]);
    long free0 = bench_rss_kb() - base, release_ms = -1, now_kb = free0;
    int n = 0;
    double tf = bench_now();
    for (long ms = 0; ms <= wait_ms; ms++) {
        if (ms % 10 == 0) {
            long elapsed = (long)((bench_now() - tf) * 1000.0);
            now_kb = bench_rss_kb() - base;
            if (n < MAX_SAMPLES) {
                trace_ms[n] = elapsed;
                trace_kb[n++] = now_kb;
            }
            if (release_ms < 0 && now_kb * 10 <= grow)
                release_ms = elapsed;
        }
        void *p = bench_check(malloc(64), "malloc");
        bench_escape(p);
        free(p);
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }

    char extra[256];
    snprintf(extra, sizeof extra,
             " count=%zu keep=%d live_peak_kb=%zu rss_grow_kb=%ld frag_ratio=%.3f"
             " rss_free0_kb=%ld rss_end_kb=%ld release_ms=%ld",
             count, keep, live_peak / 1024, grow,
             live_peak ? (double)grow / ((double)live_peak / 1024.0) : 0.0, free0, now_kb,
             release_ms);
    bench_result("memory", extra, ops, secs);
    for (int i = 0; i < n; i++)
        printf("TRACE ms=%ld rss_kb=%ld\n", trace_ms[i], trace_kb[i]);
    return 0;
}
