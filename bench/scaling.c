/*
 * scaling: thread-local random replacement, for 1..N threads. Each thread
 * owns `slots` blocks of 16..1024 bytes and replaces a random one in a
 * loop; nothing crosses threads, so the figure shows how the allocator's
 * fast paths scale (and what oversubscription costs: 8 threads on 2 cores).
 *   threads=1 slots=1000 seconds=1
 * ops = replacements, all threads together.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

struct worker {
    struct bench_thread th;
    size_t nslots;
    uint64_t rng;
} __attribute__((aligned(64)));

static void *work(void *arg)
{
    struct worker *w = arg;
    void **slot = bench_check(calloc(w->nslots, sizeof *slot), "calloc");
    w->th.ops = (double)bench_replace_slots(slot, w->nslots, &w->rng, 16, 1024, -1);
    for (size_t i = 0; i < w->nslots; i++)
        free(slot[i]);
    free(slot);
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = (int)bench_arg(argc, argv, "threads", 1);
    size_t nslots = (size_t)bench_arg(argc, argv, "slots", 1000);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    struct worker *w = bench_thread_args(threads, sizeof *w);
    for (int i = 0; i < threads; i++)
        w[i] = (struct worker){ .nslots = nslots, .rng = 0xabcdefULL * (uint64_t)(i + 1) };

    double ops, t = bench_run_threads(threads, work, w, sizeof *w, seconds, &ops);
    free(w);
    char extra[64];
    snprintf(extra, sizeof extra, " threads=%d slots=%zu", threads, nslots);
    bench_result("scaling", extra, ops, t);
    return 0;
}
