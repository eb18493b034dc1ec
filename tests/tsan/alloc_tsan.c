/*
 * Allocator concurrency under ThreadSanitizer (Criterion cannot start under
 * TSan, so this is a plain program: exit 0 on success, 1 with a message on
 * a failed check; TSan reports fail it with exit code 66).
 *
 * Uses the gs_ API directly: under TSan, malloc/free are TSan's own
 * interceptors, while gs_malloc/gs_free/gs_free_rcu are graceslab's.
 * Covered: cross-thread frees (remote chain, adoption of released slabs),
 * thread exit with live objects (abandonment, orphan adoption), gs_free_rcu
 * from several threads with readers validating objects (pending chains,
 * reclaim on refill, sweep), gs_reclaim, caches, heaps that keep their
 * full slabs while other threads free into them, and a sweep racing the
 * owner's new format of a medium slab.
 */
#include "graceslab.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "alloc_tsan: check failed: %s (line %d)\n", #cond, \
                    __LINE__);                                                 \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

enum { QUEUE = 1024, SLOTS = 512, ROUNDS = 20000 };

/* A single-producer single-consumer ring per (producer, consumer) pair. */
struct ring {
    void *_Atomic item[QUEUE];
    _Atomic unsigned head, tail;
};

static struct ring rings[4];
static atomic_bool stop;

static size_t size_of(unsigned r)
{
    static const size_t sizes[] = {16, 24, 64, 100, 256, 700, 2000, 9000, 40000, 270000};
    return sizes[r % (sizeof sizes / sizeof sizes[0])];
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i += 8)
        p[i] = (unsigned char)(seed + i);
}

static void verify(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i += 8)
        CHECK(p[i] == (unsigned char)(seed + i));
}

struct msg {
    size_t size;
    unsigned seed;
};

static void *producer(void *arg)
{
    struct ring *q = arg;
    unsigned r = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < ROUNDS; i++) {
        r = r * 1103515245u + 12345u;
        size_t n = size_of(r >> 8);
        struct msg *m = gs_malloc(n < sizeof *m ? sizeof *m : n);
        CHECK(m);
        fill((unsigned char *)m, n, r);
        m->size = n;
        m->seed = r;
        unsigned t = atomic_load_explicit(&q->tail, memory_order_relaxed);
        while (t - atomic_load_explicit(&q->head, memory_order_acquire) == QUEUE)
            sched_yield();
        atomic_store_explicit(&q->item[t % QUEUE], m, memory_order_relaxed);
        atomic_store_explicit(&q->tail, t + 1, memory_order_release);
    }
    return NULL;
}

static void *consumer(void *arg)
{
    struct ring *q = arg;
    for (int i = 0; i < ROUNDS; i++) {
        unsigned h = atomic_load_explicit(&q->head, memory_order_relaxed);
        while (atomic_load_explicit(&q->tail, memory_order_acquire) == h)
            sched_yield();
        struct msg *m = atomic_load_explicit(&q->item[h % QUEUE], memory_order_relaxed);
        atomic_store_explicit(&q->head, h + 1, memory_order_release);
        size_t n = m->size;
        unsigned seed = m->seed;
        /* The header fields overwrote the first pattern bytes. */
        verify((unsigned char *)m + 16, n > 16 ? n - 16 : 0, seed + 16);
        gs_free(m); /* a remote free: the producer's slab */
    }
    return NULL;
}

/* Threads that exit with live objects: another thread frees them. */
static void *leaver(void *arg)
{
    void **out = arg;
    for (int i = 0; i < 64; i++) {
        out[i] = gs_malloc(size_of((unsigned)i));
        CHECK(out[i]);
        memset(out[i], 0x5a, 16);
    }
    return NULL;
}

/* Replace-and-defer with readers. */
struct obj {
    uintptr_t key, check;
};
static struct obj *slots[SLOTS]; /* published with gs_rcu_* */
static atomic_long corrupt;

static void *reader(void *arg)
{
    (void)arg;
    unsigned r = 1;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        gs_rcu_read_lock();
        for (int k = 0; k < 16; k++) {
            r = r * 1103515245u + 12345u;
            struct obj *o = gs_rcu_dereference(slots[(r >> 8) % SLOTS]);
            if (o->check != ~o->key)
                atomic_fetch_add(&corrupt, 1);
        }
        gs_rcu_read_unlock();
    }
    return NULL;
}

static void *updater(void *arg)
{
    unsigned r = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < ROUNDS * 4; i++) {
        r = r * 1103515245u + 12345u;
        struct obj *o = gs_malloc(r & 1 ? sizeof *o : 270000); /* small or large */
        CHECK(o);
        o->key = r;
        o->check = ~(uintptr_t)r;
        /* Several updaters: exchange (acq_rel) publishes o like
           gs_rcu_assign_pointer and hands the old object to one of them. */
        struct obj *old = __atomic_exchange_n(&slots[(r >> 8) % SLOTS], o, __ATOMIC_ACQ_REL);
        gs_free_rcu(old);
    }
    return NULL;
}

/* 5. Full slabs kept owned (alloc/heap.c, "Full slabs"): each keeper
   replaces random blocks among many of its own, so its frees adopt back
   its released slabs and it starts keeping its used-up slabs; every 16th
   replacement it also hands an old block to the others through a mailbox
   and frees the one it got: remote frees into another keeper's full
   slabs, which end that keeper's keeping, and so on again. Contents
   checked. */
enum { KEEP_SLOTS = 20000, KEEP_ROUNDS = 100000 };
static void *_Atomic mailbox[8];

static void *keeper(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    void **slot = calloc(KEEP_SLOTS, sizeof *slot); /* the test's own: libc's */
    unsigned *seed_of = calloc(KEEP_SLOTS, sizeof *seed_of);
    CHECK(slot && seed_of);
    uint64_t r = 0x9e3779b97f4a7c15ull * (id + 1);
    for (unsigned k = 0; k < KEEP_ROUNDS; k++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        unsigned i = (unsigned)(r % KEEP_SLOTS), seed = (unsigned)(r >> 40);
        size_t n = 16 + (size_t)(r >> 20) % 497;
        if (slot[i]) {
            verify(slot[i], 16, seed_of[i]);
            gs_free(slot[i]);
        }
        CHECK((slot[i] = gs_malloc(n)));
        fill(slot[i], 16, seed);
        seed_of[i] = seed;
        if (k % 16 == 0 && slot[(i + 1) % KEEP_SLOTS]) {
            /* An old block (likely in one of this keeper's full slabs) goes
               to the mailbox, first 16 bytes 0xa5, and a new one takes its
               slot. */
            unsigned j = (i + 1) % KEEP_SLOTS;
            void *mine = slot[j];
            verify(mine, 16, seed_of[j]);
            memset(mine, 0xa5, 16);
            CHECK((slot[j] = gs_malloc(n)));
            fill(slot[j], 16, seed_of[j]);
            void *got = atomic_exchange(&mailbox[(id + k / 16) % 8], mine);
            if (got) {
                for (int b = 0; b < 16; b++)
                    CHECK(((unsigned char *)got)[b] == 0xa5);
                gs_free(got);
            }
        }
    }
    for (unsigned i = 0; i < KEEP_SLOTS; i++) {
        if (slot[i])
            verify(slot[i], 16, seed_of[i]);
        gs_free(slot[i]);
    }
    free(slot);
    free(seed_of);
    return NULL;
}

/* 6. A sweep hands a slab's pending objects to its owner, which collects
   them, finds the slab empty and formats it for another medium class
   (alloc/heap.c, "Medium reuse"), while the sweep still reads the slab's
   class and size (a review: a race, and the pending count went to the
   other class, unless the format takes the segment lock). Each round in a
   thread of its own, whose heap has no medium slab yet, so that every
   round formats a slab again (in one thread, only the first did: the
   other class kept its slab). */
static atomic_int sweep_state;

/* Relaxed: the flag orders nothing, so that TSan sees the sweep and the
   format as the concurrent accesses they are in a program that does not
   wait for the sweep (here it waits, for a deterministic run). */
static void *sweeper(void *arg)
{
    (void)arg;
    gs_reclaim(0);
    atomic_store_explicit(&sweep_state, 1, memory_order_relaxed);
    while (atomic_load_explicit(&sweep_state, memory_order_relaxed) != 2)
        ;
    return NULL;
}

static void *sweep_then_format(void *arg)
{
    (void)arg;
    void *p[14]; /* 40 KiB blocks: 14 a slab */
    for (int i = 0; i < 14; i++)
        CHECK((p[i] = gs_malloc(40000)));
    for (int i = 0; i < 14; i++)
        gs_free_rcu(p[i]);
    atomic_store_explicit(&sweep_state, 0, memory_order_relaxed);
    pthread_t sw;
    pthread_create(&sw, NULL, sweeper, NULL);
    while (atomic_load_explicit(&sweep_state, memory_order_relaxed) != 1)
        ;
    gs_free(gs_malloc(40000)); /* collects them: the active slab is empty */
    void *q = gs_malloc(50000); /* another class of its span takes it */
    CHECK(q);
    atomic_store_explicit(&sweep_state, 2, memory_order_relaxed);
    pthread_join(sw, NULL);
    gs_free(q);
    return NULL;
}

int main(void)
{
    pthread_t t[8];
    /* 1. cross-thread frees, two producer/consumer pairs */
    for (int i = 0; i < 2; i++) {
        pthread_create(&t[2 * i], NULL, producer, &rings[i]);
        pthread_create(&t[2 * i + 1], NULL, consumer, &rings[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);

    /* 2. thread exit with live objects */
    for (int round = 0; round < 50; round++) {
        void *objs[64];
        pthread_create(&t[0], NULL, leaver, objs);
        pthread_join(t[0], NULL);
        for (int i = 0; i < 64; i++) {
            CHECK(((unsigned char *)objs[i])[0] == 0x5a);
            gs_free(objs[i]);
        }
    }

    /* 3. deferred free under readers */
    for (int i = 0; i < SLOTS; i++) {
        struct obj *o = gs_malloc(sizeof *o);
        o->key = (uintptr_t)i;
        o->check = ~(uintptr_t)i;
        slots[i] = o;
    }
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, reader, NULL);
    for (int i = 2; i < 5; i++)
        pthread_create(&t[i], NULL, updater, (void *)(uintptr_t)(i * 7919));
    for (int i = 2; i < 5; i++)
        pthread_join(t[i], NULL);
    atomic_store(&stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    CHECK(atomic_load(&corrupt) == 0);
    struct gs_stats st0, st1;
    gs_stats_get(&st0);
    size_t ours = 0;
    for (int i = 0; i < SLOTS; i++) {
        ours += gs_usable_size(slots[i]);
        gs_free_rcu(slots[i]);
    }
    /* The engine's lazy thread (kicked by the updaters' refills) may sweep
       some of these before or while gs_reclaim does, and its bytes are not
       in gs_reclaim's return: the statistics count every sweep, and are
       exact once gs_reclaim returns. */
    size_t got = gs_reclaim((size_t)-1);
    gs_stats_get(&st1);
    CHECK(st1.pending_objects == 0);
    CHECK(st1.reclaimed_objects - st0.reclaimed_objects >= SLOTS);
    /* It reports no more than was pending: the updaters' leftovers and ours. */
    CHECK(got <= st0.pending_bytes + ours);

    /* 4. a cache shared by threads */
    struct gs_cache *c = gs_cache_create("tsan", 48, 16, GS_CACHE_TYPESAFE_BY_RCU);
    CHECK(c);
    void *objs[256];
    for (int i = 0; i < 256; i++)
        CHECK((objs[i] = gs_cache_alloc(c)));
    for (int i = 0; i < 256; i += 2)
        gs_cache_free(c, objs[i]);
    for (int i = 1; i < 256; i += 2)
        gs_cache_free_rcu(c, objs[i]);
    gs_cache_destroy(c);

    /* 5. full slabs kept, swapped blocks freed by other threads */
    for (uintptr_t i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, keeper, (void *)i);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 8; i++)
        gs_free(atomic_exchange(&mailbox[i], NULL));

    /* 6. a sweep, then the slab formatted for another class */
    for (int round = 0; round < 20; round++) {
        pthread_create(&t[0], NULL, sweep_then_format, NULL);
        pthread_join(t[0], NULL);
    }
    gs_reclaim((size_t)-1);
    gs_stats_get(&st1);
    for (unsigned c = 0; c < st1.nclasses; c++)
        CHECK(st1.class_pending_objects[c] == 0);
    puts("alloc_tsan: ok");
    return 0;
}
