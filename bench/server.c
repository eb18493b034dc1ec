/*
 * server: Larson-style server simulation. Each of `threads` lanes owns an
 * array of `slots` blocks (16..1024 bytes) and is served by a succession of
 * short-lived worker threads: a worker makes `steps` random replacements
 * (free a block, malloc a new one) and exits; the next worker of the lane,
 * a new thread, goes on with the same array. So most blocks are freed by a
 * thread other than the one that allocated them, often after that thread
 * has exited — as in a server whose connection threads come and go.
 *   threads=2 slots=1000 steps=20000 seconds=1
 * ops = replacements (one free + one malloc).
 */
#include "common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct lane {
    struct bench_thread th; /* the lane's count, over all its workers */
    void **slot;
    size_t nslots;
    long steps;
    uint64_t rng;
} __attribute__((aligned(64)));

static void *worker(void *arg)
{
    struct lane *l = arg;
    l->th.ops += (double)bench_replace_slots(l->slot, l->nslots, &l->rng, 16, 1024, l->steps);
    return NULL;
}

static void *lane_driver(void *arg)
{
    struct lane *l = arg;
    while (!bench_stopped()) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, l) != 0) {
            fprintf(stderr, "server: pthread_create failed\n");
            abort();
        }
        pthread_join(t, NULL);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = (int)bench_arg(argc, argv, "threads", 2);
    size_t nslots = (size_t)bench_arg(argc, argv, "slots", 1000);
    long steps = (long)bench_arg(argc, argv, "steps", 20000);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    struct lane *lanes = bench_thread_args(threads, sizeof *lanes);
    for (int i = 0; i < threads; i++) {
        lanes[i] = (struct lane){ .nslots = nslots, .steps = steps,
                                  .rng = 0x1234567ULL * (uint64_t)(i + 1) };
        lanes[i].slot = bench_check(calloc(nslots, sizeof(void *)), "calloc");
    }

    double ops, t = bench_run_threads(threads, lane_driver, lanes, sizeof *lanes, seconds, &ops);
    for (int i = 0; i < threads; i++) {
        for (size_t j = 0; j < nslots; j++)
            free(lanes[i].slot[j]);
        free(lanes[i].slot);
    }
    free(lanes);
    char extra[96];
    snprintf(extra, sizeof extra, " threads=%d slots=%zu steps=%ld", threads, nslots, steps);
    bench_result("server", extra, ops, t);
    return 0;
}
