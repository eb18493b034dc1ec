/*
 * handoff: blocks allocated by one thread and freed by another, some of
 * them long-lived, as a table whose old entries a reclaimer thread frees
 * (a cache with a deleter thread; liburcu's call_rcu(free)).
 *   slots=100000  entries in the table (each a live block)
 *   min=32 max=512  block sizes, about log-uniform (uniform within each
 *                 doubling, each doubling as likely), every byte written
 *   writers=1     threads replacing random entries
 *   seconds=1
 * A writer puts a new block in a random slot and passes the old one, in
 * batches of 64, to the freer thread, which frees them; a writer waits
 * while more than 20,000 blocks are queued. Every slot's block lives until
 * it is replaced, so the freer's frees leave holes all over the writers'
 * slabs. ops = replacements. Beside the usual fields: live_kb, the bytes
 * in the table at the end.
 */
#include "common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct block {
    struct block *next;
    size_t size;
};

static struct block *_Atomic *table;
static size_t nslots, lo, hi;
static unsigned octaves; /* whole doublings from min to max */

static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static struct block *queue;
static atomic_long queued;
static atomic_int freer_stop;

static struct block *make(uint64_t *rng)
{
    size_t n;
    struct block *b = bench_alloc_log_written(rng, lo, hi, octaves, sizeof *b, &n);
    b->size = n;
    return b;
}

struct writer {
    struct bench_thread t;
    uint64_t rng;
} __attribute__((aligned(64)));

static void *writer(void *arg)
{
    struct writer *w = arg;
    struct block *batch = NULL, *last = NULL;
    int n = 0;
    while (!bench_stopped()) {
        size_t i = (size_t)(bench_rand(&w->rng) % nslots);
        struct block *old = atomic_exchange_explicit(&table[i], make(&w->rng),
                                                     memory_order_acq_rel);
        old->next = batch;
        if (!batch)
            last = old;
        batch = old;
        w->t.ops++;
        if (++n < 64)
            continue;
        pthread_mutex_lock(&queue_lock);
        last->next = queue;
        queue = batch;
        pthread_mutex_unlock(&queue_lock);
        atomic_fetch_add(&queued, n);
        batch = NULL;
        n = 0;
        while (atomic_load(&queued) > 20000 && !bench_stopped())
            usleep(50);
    }
    for (struct block *b = batch, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    return NULL;
}

static long free_queue(void)
{
    pthread_mutex_lock(&queue_lock);
    struct block *b = queue;
    queue = NULL;
    pthread_mutex_unlock(&queue_lock);
    long n = 0;
    for (struct block *next; b; b = next, n++) {
        next = b->next;
        free(b);
    }
    atomic_fetch_sub(&queued, n);
    return n;
}

static void *freer(void *arg)
{
    (void)arg;
    while (!atomic_load(&freer_stop))
        if (!free_queue())
            usleep(100);
    free_queue();
    return NULL;
}

int main(int argc, char **argv)
{
    nslots = (size_t)bench_arg(argc, argv, "slots", 100000);
    lo = (size_t)bench_arg(argc, argv, "min", 32);
    hi = (size_t)bench_arg(argc, argv, "max", 512);
    int writers = (int)bench_arg(argc, argv, "writers", 1);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    if (nslots < 1 || lo < 1 || hi < lo || writers < 1) {
        fprintf(stderr, "handoff: need slots >= 1, 1 <= min <= max, writers >= 1\n");
        return 2;
    }
    octaves = bench_octaves(lo, hi);
    table = bench_check(calloc(nslots, sizeof *table), "calloc");
    uint64_t rng = 1;
    for (size_t i = 0; i < nslots; i++)
        table[i] = make(&rng);

    pthread_t f;
    if (pthread_create(&f, NULL, freer, NULL)) {
        fprintf(stderr, "handoff: pthread_create failed\n");
        return 1;
    }
    struct writer *w = bench_thread_args(writers, sizeof *w);
    for (int i = 0; i < writers; i++)
        w[i].rng = 977 * (uint64_t)(i + 1) + 3;
    double ops;
    double secs = bench_run_threads(writers, writer, w, sizeof *w, seconds, &ops);
    atomic_store(&freer_stop, 1);
    pthread_join(f, NULL);

    size_t live = 0;
    for (size_t i = 0; i < nslots; i++)
        live += table[i]->size;
    char extra[128];
    snprintf(extra, sizeof extra, " slots=%zu min=%zu max=%zu writers=%d live_kb=%zu", nslots, lo,
             hi, writers, live / 1024);
    bench_result("handoff", extra, ops, secs);
    for (size_t i = 0; i < nslots; i++)
        free(table[i]);
    free(table);
    return 0;
}
