/*
 * falseshare: small blocks from different threads written concurrently
 * (Hoard's cache-thrash and cache-scratch). Each thread loops: malloc(size),
 * write every byte of it `writes` times, free. With passive=1 the main
 * thread first allocates one block per thread back to back (likely sharing
 * cache lines) and each thread starts by freeing the one it is given — an
 * allocator that hands that memory straight back to the freeing thread
 * keeps the threads' blocks on shared cache lines.
 *   threads=2 size=8 writes=100 passive=1 seconds=1
 * ops = block writes (malloc/free pairs x writes), all threads.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

struct worker {
    struct bench_thread th;
    char *given; /* passive: a block from the main thread, freed first */
    size_t size;
    long writes;
} __attribute__((aligned(64)));

static void *work(void *arg)
{
    struct worker *w = arg;
    free(w->given);
    double ops = 0;
    while (!bench_stopped()) {
        for (int k = 0; k < 64; k++) {
            volatile char *p = bench_check(malloc(w->size), "malloc");
            for (long i = 0; i < w->writes; i++)
                for (size_t j = 0; j < w->size; j++)
                    p[j]++;
            free((void *)p);
        }
        ops += 64.0 * (double)w->writes;
    }
    w->th.ops = ops;
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = (int)bench_arg(argc, argv, "threads", 2);
    size_t size = (size_t)bench_arg(argc, argv, "size", 8);
    long writes = (long)bench_arg(argc, argv, "writes", 100);
    int passive = (int)bench_arg(argc, argv, "passive", 1);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    struct worker *w = bench_thread_args(threads, sizeof *w);
    for (int i = 0; i < threads; i++)
        w[i] = (struct worker){ .size = size, .writes = writes,
                                .given = passive ? bench_check(malloc(size), "malloc")
                                                 : NULL };

    double ops, t = bench_run_threads(threads, work, w, sizeof *w, seconds, &ops);
    free(w);
    char extra[96];
    snprintf(extra, sizeof extra, " threads=%d size=%zu writes=%ld passive=%d", threads, size,
             writes, passive);
    bench_result("falseshare", extra, ops, t);
    return 0;
}
