/*
 * prodcons: cross-thread free. threads/2 producer-consumer pairs (at least
 * one), each joined by a lock-free single-producer single-consumer ring of
 * 1024 pointers. The producer mallocs blocks and writes them; the consumer
 * reads and frees them, so every free is a remote free.
 *   threads=2   size=64 (0: random 16..256)   seconds=1
 * ops = blocks handed over and freed, all pairs together.
 */
#include "common.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#define RING 1024 /* power of two */

struct ring {
    _Alignas(64) atomic_size_t head; /* written by the consumer only */
    _Alignas(64) atomic_size_t tail; /* written by the producer only */
    _Alignas(64) void *slot[RING];
};

struct role {
    struct bench_thread th; /* consumers count the blocks they free */
    struct ring *ring;
    int producer;
    size_t size;
} __attribute__((aligned(64)));

/* Waits politely: two threads per pair on two cores, with other pairs and
   other load around, so spinning alone could starve the peer. */
static void backoff(unsigned *spins)
{
    if (++*spins > 64) {
        sched_yield();
        *spins = 0;
    }
}

static void produce(struct role *r)
{
    struct ring *q = r->ring;
    uint64_t rng = (uint64_t)(uintptr_t)r | 1;
    size_t tail = atomic_load_explicit(&q->tail, memory_order_relaxed);
    unsigned spins = 0;
    for (;;) {
        int stop = bench_stopped();
        /* acquire: pairs with the consumer's release of head, so its
           reads of the slots we overwrite are done. */
        while (tail - atomic_load_explicit(&q->head, memory_order_acquire) == RING)
            backoff(&spins);
        size_t size = r->size ? r->size : bench_rand_range(&rng, 16, 256);
        size_t *p = stop ? NULL : bench_check(malloc(size), "malloc");
        if (p)
            *p = size;
        q->slot[tail % RING] = p;
        /* release: the slot and the block's contents before the index. */
        atomic_store_explicit(&q->tail, ++tail, memory_order_release);
        if (stop)
            return;
    }
}

static void consume(struct role *r)
{
    struct ring *q = r->ring;
    size_t head = atomic_load_explicit(&q->head, memory_order_relaxed);
    unsigned spins = 0;
    double ops = 0;
    for (;;) {
        /* acquire: pairs with the producer's release of tail. */
        size_t tail;
        while ((tail = atomic_load_explicit(&q->tail, memory_order_acquire)) == head)
            backoff(&spins);
        for (; head != tail; head++) {
            size_t *p = q->slot[head % RING];
            if (!p) {
                r->th.ops = ops;
                return;
            }
            bench_escape((void *)(uintptr_t)*p);
            free(p);
            ops++;
        }
        /* release: our reads of the slots before the producer reuses them. */
        atomic_store_explicit(&q->head, head, memory_order_release);
    }
}

static void *run(void *arg)
{
    struct role *r = arg;
    if (r->producer)
        produce(r);
    else
        consume(r);
    return NULL;
}

int main(int argc, char **argv)
{
    int pairs = (int)bench_arg(argc, argv, "threads", 2) / 2;
    size_t size = (size_t)bench_arg(argc, argv, "size", 64);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    if (pairs < 1)
        pairs = 1;
    struct ring *rings = bench_check(aligned_alloc(64, (size_t)pairs * sizeof *rings),
                                     "aligned_alloc");
    struct role *roles = bench_thread_args(2 * pairs, sizeof *roles);
    for (int i = 0; i < pairs; i++) {
        atomic_init(&rings[i].head, 0);
        atomic_init(&rings[i].tail, 0);
        roles[2 * i] = (struct role){ .ring = &rings[i], .producer = 1, .size = size };
        roles[2 * i + 1] = (struct role){ .ring = &rings[i], .producer = 0, .size = size };
    }

    double ops, t = bench_run_threads(2 * pairs, run, roles, sizeof *roles, seconds, &ops);
    free(roles);
    free(rings);
    char extra[64];
    snprintf(extra, sizeof extra, " threads=%d size=%zu", 2 * pairs, size);
    bench_result("prodcons", extra, ops, t);
    return 0;
}
