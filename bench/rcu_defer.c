/*
 * Replace-and-defer: 4096 slots of 64-byte objects; readers validate
 * objects under a read-side critical section while writers replace them and
 * defer the free of the old one. Live set: 256 KiB.
 *
 * Built twice:
 *   rcu_defer_gs    gs_free_rcu (graceslab's deferred free in the slab)
 *   rcu_defer_urcu  liburcu-memb, with mode=callrcu (call_rcu + free),
 *                   mode=batch (kfree_rcu-style: pointer pages of 510, one
 *                   call_rcu per page), mode=sync (synchronize_rcu per 510
 *                   frees), mode=defer (liburcu's defer_rcu) — run on glibc
 *                   or under LD_PRELOAD=libjemalloc.
 * The gs build also reports the pending backlog (gs_stats_get sampled every
 * 10 ms: the most objects ever pending) and the grace periods completed.
 * Arguments: readers=N writers=N seconds=S mode=...
 * Prints: RESULT name=rcu_defer impl=... updates_per_sec=... reads_per_sec=...
 *         peak_rss_kb=... live_kb=256
 */
#include "rcu_bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DEFER_GS
#include "graceslab.h"
#define read_lock() gs_rcu_read_lock()
#define read_unlock() gs_rcu_read_unlock()
#define reg_thread() gs_rcu_register_thread()
#define unreg_thread() gs_rcu_unregister_thread()
#define obj_alloc(n) gs_malloc(n)
#else
#include <urcu/urcu-memb.h>
#include <urcu/defer.h>
#define read_lock() urcu_memb_read_lock()
#define read_unlock() urcu_memb_read_unlock()
#define reg_thread() urcu_memb_register_thread()
#define unreg_thread() urcu_memb_unregister_thread()
#define obj_alloc(n) malloc(n)
#endif

#define SLOTS 4096
#define BATCH 510

struct obj {
    unsigned long key, check;
#ifndef DEFER_GS
    struct rcu_head head;
#endif
    char pad[64 - 2 * sizeof(unsigned long)
#ifndef DEFER_GS
             - sizeof(struct rcu_head)
#endif
    ];
};

static struct obj *_Atomic slots[SLOTS];
static atomic_bool stop;
static atomic_long total_updates, total_reads, corrupt;
static const char *mode = "gs";

#ifndef DEFER_GS
static void free_obj_cb(struct rcu_head *h)
{
    free(caa_container_of(h, struct obj, head));
}
struct batch {
    struct rcu_head head;
    int n;
    void *ptr[BATCH];
};
static void free_batch_cb(struct rcu_head *h)
{
    struct batch *b = caa_container_of(h, struct batch, head);
    for (int i = 0; i < b->n; i++)
        free(b->ptr[i]);
    free(b);
}
#endif

static void *reader(void *arg)
{
    unsigned r = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    long reads = 0;
    reg_thread();
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        read_lock();
        for (int k = 0; k < 64; k++) {
            r = r * 1103515245u + 12345u;
            struct obj *o = atomic_load_explicit(&slots[(r >> 8) % SLOTS], memory_order_acquire);
            if (o->check != ~o->key)
                atomic_fetch_add(&corrupt, 1);
        }
        read_unlock();
        reads += 64;
    }
    unreg_thread();
    atomic_fetch_add(&total_reads, reads);
    return NULL;
}

static void *writer(void *arg)
{
    unsigned r = (unsigned)(uintptr_t)arg * 40503u + 7;
    long updates = 0;
    reg_thread();
#ifndef DEFER_GS
    if (!strcmp(mode, "defer"))
        urcu_memb_defer_register_thread();
#endif
#ifndef DEFER_GS
    struct batch *b = NULL;
#endif
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int k = 0; k < 256; k++) {
            r = r * 1103515245u + 12345u;
            struct obj *o = obj_alloc(sizeof *o);
            o->key = r;
            o->check = ~o->key;
            struct obj *old = atomic_exchange_explicit(&slots[(r >> 8) % SLOTS], o,
                                                       memory_order_acq_rel);
#ifdef DEFER_GS
            gs_free_rcu(old);
#else
            if (!strcmp(mode, "callrcu")) {
                urcu_memb_call_rcu(&old->head, free_obj_cb);
            } else if (!strcmp(mode, "defer")) {
                urcu_memb_defer_rcu(free, old);
            } else {
                if (!b) {
                    b = malloc(sizeof *b);
                    b->n = 0;
                }
                b->ptr[b->n++] = old;
                if (b->n == BATCH) {
                    if (!strcmp(mode, "sync")) {
                        urcu_memb_synchronize_rcu();
                        free_batch_cb(&b->head);
                    } else {
                        urcu_memb_call_rcu(&b->head, free_batch_cb);
                    }
                    b = NULL;
                }
            }
#endif
        }
        updates += 256;
    }
#ifndef DEFER_GS
    if (!strcmp(mode, "defer"))
        urcu_memb_defer_unregister_thread();
#endif
    unreg_thread();
    atomic_fetch_add(&total_updates, updates);
    return NULL;
}

int main(int argc, char **argv)
{
    int readers = (int)rb_arg(argc, argv, "readers", 1);
    int writers = (int)rb_arg(argc, argv, "writers", 1);
    double seconds = rb_arg(argc, argv, "seconds", 2);
#ifndef DEFER_GS
    mode = "callrcu";
#endif
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "mode=", 5))
            mode = argv[i] + 5;
    for (int i = 0; i < SLOTS; i++) {
        struct obj *o = obj_alloc(sizeof *o);
        o->key = i;
        o->check = ~o->key;
        slots[i] = o;
    }
    pthread_t t[64];
    int n = 0;
    for (int i = 0; i < readers; i++)
        pthread_create(&t[n++], NULL, reader, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < writers; i++)
        pthread_create(&t[n++], NULL, writer, (void *)(uintptr_t)(i + 1));
    double t0 = rb_now();
    size_t backlog = 0;
    unsigned long gp0 = 0, gp1 = 0;
#ifdef DEFER_GS
    struct gs_stats st;
    gs_stats_get(&st);
    gp0 = st.gp_completed;
    while (rb_now() - t0 < seconds) {
        struct timespec tick = {0, 10000000};
        nanosleep(&tick, NULL);
        gs_stats_get(&st);
        if (st.pending_objects > backlog)
            backlog = st.pending_objects;
    }
    gp1 = st.gp_completed;
#else
    struct timespec d = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&d, NULL);
#endif
    atomic_store(&stop, true);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    double el = rb_now() - t0;
    printf("RESULT name=rcu_defer impl=%s readers=%d writers=%d updates_per_sec=%.0f "
           "reads_per_sec=%.0f peak_rss_kb=%ld live_kb=%d corrupt=%ld max_pending=%zu "
           "grace_periods=%lu\n",
#ifdef DEFER_GS
           "gs_free_rcu",
#else
           mode,
#endif
           readers, writers, total_updates / el, total_reads / el, rb_peak_rss_kb(),
           (int)(SLOTS * sizeof(struct obj) / 1024), (long)corrupt, backlog, gp1 - gp0);
    return corrupt != 0;
}
