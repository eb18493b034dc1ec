/*
 * pool: a thread pool whose threads free each other's blocks, some of them
 * long-lived. Producers allocate work items and queue them; workers take
 * them, free most, keep some in a ring of recent ones (a cache, a log) and
 * allocate a result for every other item, which the producers free.
 *   producers=4 workers=12
 *   min=16 max=1024  block sizes, about log-uniform (uniform within each
 *                 doubling, each doubling as likely), every byte written
 *   ring=2000     items each worker keeps (the oldest freed when full)
 *   keep=4        one item in `keep` goes to the ring
 *   queue=4096    items queued at most (producers wait beyond)
 *   seconds=1
 * Every thread allocates and frees every size class, most frees land in
 * another thread's slabs, and the ring's blocks pin holes everywhere: peak
 * RSS is the figure. ops = items the workers took. Beside the usual
 * fields: live_kb, the bytes in the workers' rings at the end.
 */
#include "common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct item {
    struct item *next;
    size_t size;
};

static size_t lo, hi, ring_len, keep;
static unsigned octaves; /* whole doublings from min to max */
static int producers;
static long queue_max;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t not_empty = PTHREAD_COND_INITIALIZER, not_full = PTHREAD_COND_INITIALIZER;
static struct item *head, *tail; /* work queue (lock) */
static long queued;              /* (lock) */
static struct item *results;     /* results back to the producers (lock) */

static struct item *make(uint64_t *rng)
{
    size_t n;
    struct item *it = bench_alloc_log_written(rng, lo, hi, octaves, sizeof *it, &n);
    it->size = n;
    it->next = NULL;
    return it;
}

static void free_list(struct item *it)
{
    for (struct item *next; it; it = next) {
        next = it->next;
        free(it);
    }
}

/* Waits on c for at most a millisecond, so that a stop is seen. */
static void wait_briefly(pthread_cond_t *c)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(c, &lock, &ts);
}

struct role {
    struct bench_thread t;
    int index;
    uint64_t rng;
    struct item **ring;
    size_t next_slot;
} __attribute__((aligned(64)));

static void produce(struct role *r)
{
    while (!bench_stopped()) {
        pthread_mutex_lock(&lock);
        struct item *done = results;
        results = NULL;
        pthread_mutex_unlock(&lock);
        free_list(done);
        struct item *it = make(&r->rng);
        pthread_mutex_lock(&lock);
        while (queued >= queue_max && !bench_stopped())
            wait_briefly(&not_full);
        if (tail)
            tail->next = it;
        else
            head = it;
        tail = it;
        queued++;
        pthread_cond_signal(&not_empty);
        pthread_mutex_unlock(&lock);
    }
}

static void work(struct role *r)
{
    for (;;) {
        pthread_mutex_lock(&lock);
        while (!head && !bench_stopped())
            wait_briefly(&not_empty);
        struct item *it = head;
        if (!it) {
            pthread_mutex_unlock(&lock);
            return;
        }
        head = it->next;
        if (!head)
            tail = NULL;
        queued--;
        pthread_cond_signal(&not_full);
        pthread_mutex_unlock(&lock);
        r->t.ops++;
        uint64_t x = bench_rand(&r->rng);
        if (x % keep == 0) {
            free(r->ring[r->next_slot]);
            r->ring[r->next_slot] = it;
            r->next_slot = (r->next_slot + 1) % ring_len;
        } else {
            free(it);
        }
        if (x >> 63) {
            struct item *res = make(&r->rng);
            pthread_mutex_lock(&lock);
            res->next = results;
            results = res;
            pthread_mutex_unlock(&lock);
        }
    }
}

static void *pool_thread(void *arg)
{
    struct role *r = arg;
    if (r->index < producers)
        produce(r);
    else
        work(r);
    return NULL;
}

int main(int argc, char **argv)
{
    producers = (int)bench_arg(argc, argv, "producers", 4);
    int workers = (int)bench_arg(argc, argv, "workers", 12);
    lo = (size_t)bench_arg(argc, argv, "min", 16);
    hi = (size_t)bench_arg(argc, argv, "max", 1024);
    ring_len = (size_t)bench_arg(argc, argv, "ring", 2000);
    keep = (size_t)bench_arg(argc, argv, "keep", 4);
    queue_max = (long)bench_arg(argc, argv, "queue", 4096);
    double seconds = bench_arg(argc, argv, "seconds", 1.0);
    if (producers < 1 || workers < 1 || lo < 1 || hi < lo || ring_len < 1 || keep < 1 ||
        queue_max < 1) {
        fprintf(stderr, "pool: need producers, workers, ring, keep, queue >= 1 and "
                        "1 <= min <= max\n");
        return 2;
    }
    octaves = bench_octaves(lo, hi);
    int n = producers + workers;
    struct role *roles = bench_thread_args(n, sizeof *roles);
    for (int i = 0; i < n; i++) {
        roles[i].index = i;
        roles[i].rng = 7919 * (uint64_t)(i + 1) + 1;
        if (i >= producers)
            roles[i].ring = bench_check(calloc(ring_len, sizeof *roles[i].ring), "calloc");
    }
    double ops;
    double secs = bench_run_threads(n, pool_thread, roles, sizeof *roles, seconds, &ops);

    size_t live = 0;
    for (int i = producers; i < n; i++)
        for (size_t k = 0; k < ring_len; k++)
            if (roles[i].ring[k])
                live += roles[i].ring[k]->size;
    char extra[160];
    snprintf(extra, sizeof extra,
             " producers=%d workers=%d min=%zu max=%zu ring=%zu keep=%zu queue=%ld live_kb=%zu",
             producers, workers, lo, hi, ring_len, keep, queue_max, live / 1024);
    bench_result("pool", extra, ops, secs);
    for (int i = producers; i < n; i++) {
        for (size_t k = 0; k < ring_len; k++)
            free(roles[i].ring[k]);
        free(roles[i].ring);
    }
    free_list(head);
    free_list(results);
    return 0;
}
