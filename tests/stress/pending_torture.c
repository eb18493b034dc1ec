/*
 * Deferred-free torture: readers validate objects under gs_rcu_read_lock()
 * while writers replace them in a slot array (gs_rcu_assign_pointer) and
 * gs_free_rcu() the old ones. Any reuse of an object's memory before its
 * grace period ends shows as corruption:
 *   - every object carries key, ~key, its slot, its size and a payload whose
 *     every word derives from key: another object's contents, allocator
 *     metadata or a scratch fill written over it do not validate;
 *   - a reader snapshots the header of the objects it holds and checks them
 *     again at the end of its section (after yielding the CPU): the memory
 *     of a published object never changes while a reader can see it;
 *   - writers also churn gs_malloc/gs_free of scratch blocks filled with
 *     0xEE, which would land on any object reused too early.
 * Sizes mix small and medium classes and large blocks (> 256 KiB). Threads oversubscribe
 * two CPUs (4 readers + 3 writers).
 *
 * Length: GS_TORTURE_UPDATES (default 1 million; 10 million for the long
 * run), at least GS_TORTURE_SECONDS seconds if set.
 */
#include "include/graceslab.h"
#include "tests/stress/pending_common.h"

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdatomic.h>

#define NSLOTS 2048
#define NREADERS 4
#define NWRITERS 3
#define HELD 4 /* objects a reader holds across its whole section */

struct obj {
    uint64_t key;
    uint64_t nkey;
    uint32_t slot;
    uint32_t size;
    uint64_t gen;
    uint64_t w[]; /* (size - header) / 8 payload words */
};

static struct obj *slots[NSLOTS];
static _Atomic uint64_t next_key = 1;
static _Atomic unsigned long updates_done;
static _Atomic bool stop_readers, stop_writers;
static unsigned long updates_target;
static double min_seconds, t_start;

static _Atomic unsigned long corruptions, reads_checked;
static char first_error[512];
static _Atomic bool have_first_error;

static inline uint64_t word_of(uint64_t key, size_t i)
{
    return (key * 0x9E3779B97F4A7C15ull) ^ (i * 0xD6E8FEB86659FD93ull) ^ 0x5bd1e995u;
}

static inline size_t nwords(uint32_t size)
{
    return (size - sizeof(struct obj)) / 8;
}

static void report(const char *what, const struct obj *o, uint32_t slot, uint64_t detail)
{
    atomic_fetch_add(&corruptions, 1);
    if (!atomic_exchange(&have_first_error, true))
        snprintf(first_error, sizeof first_error,
                 "%s: object %p in slot %u (key %llu, ~key ok %d, slot field %u, size %u, "
                 "gen %llu), detail %llu",
                 what, (const void *)o, slot, (unsigned long long)o->key, o->nkey == ~o->key,
                 o->slot, o->size, (unsigned long long)o->gen, (unsigned long long)detail);
}

/* ----------------------------------------------------------- sizes */

static const uint32_t small_sizes[] = {32, 40, 48, 64, 96, 128, 160, 256, 384, 512,
                                       1000, 2048, 4000, 8192, 16000, 32768, 40000};

static uint32_t pick_size(uint64_t *rng)
{
    uint64_t r = gst_rand(rng);
    if ((r & 1023) == 0) /* 1/1024: a large block, 257 KiB .. 384 KiB (each one
                            deferred is past the expedite bound: the next
                            large allocation waits for a grace period) */
        return (uint32_t)(257 * 1024 + (r >> 8) % (128 * 1024));
    /* mostly small: weight towards the smallest classes */
    unsigned n = sizeof small_sizes / sizeof small_sizes[0];
    unsigned i = (unsigned)((r >> 8) % n);
    if ((r >> 20) & 1)
        i /= 3;
    return small_sizes[i];
}

/* ----------------------------------------------------------- writers */

static struct obj *make(uint32_t slot, uint32_t size, uint64_t gen)
{
    struct obj *o = gs_malloc(size);
    if (!o) { /* threads cannot cr_assert: the crash is the failure */
        fprintf(stderr, "gs_malloc(%u) failed: %s\n", size, strerror(errno));
        abort();
    }
    o->key = atomic_fetch_add_explicit(&next_key, 1, memory_order_relaxed);
    o->nkey = ~o->key;
    o->slot = slot;
    o->size = size;
    o->gen = gen;
    size_t n = nwords(size);
    for (size_t i = 0; i < n; i++)
        o->w[i] = word_of(o->key, i);
    return o;
}

static void *writer(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    uint64_t rng = 0x1234567 + id * 7919;
    uint64_t gen = 0;
    unsigned long local = 0;
    while (!atomic_load_explicit(&stop_writers, memory_order_relaxed)) {
        for (int k = 0; k < 64; k++) {
            /* writer id owns the slots with slot % NWRITERS == id */
            uint32_t slot = (uint32_t)(gst_rand(&rng) % (NSLOTS / NWRITERS)) * NWRITERS + id;
            struct obj *o = make(slot, pick_size(&rng), ++gen);
            struct obj *old = slots[slot];
            gs_rcu_assign_pointer(slots[slot], o);
            gs_free_rcu(old);
            if ((k & 7) == 0) {
                /* Scratch churn: immediate reuse of free memory. A pending
                   object handed out here would be overwritten with 0xEE. */
                size_t sz = pick_size(&rng);
                void *s = gs_malloc(sz);
                if (!s)
                    abort();
                memset(s, 0xEE, sz);
                gs_free(s);
            }
        }
        local += 64;
        unsigned long total =
            atomic_fetch_add_explicit(&updates_done, 64, memory_order_relaxed) + 64;
        if (total >= updates_target && gst_now_s() - t_start >= min_seconds)
            atomic_store(&stop_writers, true);
    }
    return (void *)(uintptr_t)local;
}

/* ----------------------------------------------------------- readers */

struct snap {
    const struct obj *o;
    uint32_t slot;
    uint64_t key, gen;
    uint32_t size;
};

/* Validates o (found in slot); fills *s with its header. */
static bool check(const struct obj *o, uint32_t slot, uint64_t *rng, struct snap *s)
{
    const volatile struct obj *v = (const volatile struct obj *)o;
    s->o = o;
    s->slot = slot;
    s->key = v->key;
    s->gen = v->gen;
    s->size = v->size;
    if (v->nkey != ~s->key) {
        report("key/~key mismatch", o, slot, v->nkey);
        return false;
    }
    if (v->slot != slot) {
        report("object in the wrong slot (another object's contents)", o, slot, v->slot);
        return false;
    }
    if (s->size < sizeof(struct obj) || s->size > 385 * 1024) { /* pick_size's range */
        report("impossible size", o, slot, s->size);
        return false;
    }
    size_t n = nwords(s->size);
    const volatile uint64_t *w = v->w;
    size_t probe[12];
    unsigned np = 0;
    for (size_t i = 0; i < 4 && i < n; i++)
        probe[np++] = i;
    for (size_t i = n > 4 ? n - 4 : 0; i < n; i++)
        probe[np++] = i;
    for (int i = 0; i < 4 && n; i++)
        probe[np++] = (size_t)(gst_rand(rng) % n);
    for (unsigned i = 0; i < np; i++)
        if (w[probe[i]] != word_of(s->key, probe[i])) {
            report("payload word does not belong to the object", o, slot, probe[i]);
            return false;
        }
    return true;
}

/* The header must be exactly as at the start of the section. */
static void recheck(const struct snap *s)
{
    const volatile struct obj *v = (const volatile struct obj *)s->o;
    if (v->key != s->key || v->nkey != ~s->key || v->gen != s->gen || v->size != s->size ||
        v->slot != s->slot) {
        report("object changed while a reader held it (reused before its grace period)",
               s->o, s->slot, s->key);
        return;
    }
    size_t n = nwords(s->size);
    if (n && s->o->w[n - 1] != word_of(s->key, n - 1))
        report("last payload word changed while a reader held it", s->o, s->slot, n - 1);
}

static void *reader(void *arg)
{
    uint64_t rng = 0xabcdef + (uintptr_t)arg * 104729;
    unsigned long checked = 0;
    unsigned iter = 0;
    while (!atomic_load_explicit(&stop_readers, memory_order_relaxed)) {
        struct snap held[HELD], tmp;
        gs_rcu_read_lock();
        for (int i = 0; i < HELD; i++) {
            uint32_t slot = (uint32_t)(gst_rand(&rng) % NSLOTS);
            const struct obj *o = gs_rcu_dereference(slots[slot]);
            check(o, slot, &rng, &held[i]);
        }
        for (int i = 0; i < 16; i++) {
            uint32_t slot = (uint32_t)(gst_rand(&rng) % NSLOTS);
            check(gs_rcu_dereference(slots[slot]), slot, &rng, &tmp);
        }
        /* Stretch some sections across many updates by other threads. */
        if ((++iter & 15) == 0)
            sched_yield();
        for (int i = 0; i < HELD; i++)
            recheck(&held[i]);
        gs_rcu_read_unlock();
        checked += HELD + 16;
    }
    atomic_fetch_add(&reads_checked, checked);
    return NULL;
}

/* ----------------------------------------------------------- the test */

Test(pending_torture, readers_never_see_reused_memory, .timeout = 1800)
{
    updates_target = gsp_updates(1000000);
    min_seconds = gsp_seconds();
    int ncpu = gsp_limit_cpus(2);
    uint64_t rng = 42;
    for (uint32_t i = 0; i < NSLOTS; i++)
        slots[i] = make(i, pick_size(&rng), 0);
    struct gs_stats st0, st1;
    gs_reclaim(SIZE_MAX);
    gs_stats_get(&st0);

    t_start = gst_now_s();
    pthread_t r[NREADERS], w[NWRITERS];
    for (uintptr_t i = 0; i < NREADERS; i++)
        cr_assert_eq(pthread_create(&r[i], NULL, reader, (void *)i), 0);
    for (uintptr_t i = 0; i < NWRITERS; i++)
        cr_assert_eq(pthread_create(&w[i], NULL, writer, (void *)i), 0);
    unsigned long updates = 0;
    for (int i = 0; i < NWRITERS; i++) {
        void *ret;
        pthread_join(w[i], &ret);
        updates += (uintptr_t)ret;
    }
    atomic_store(&stop_readers, true);
    for (int i = 0; i < NREADERS; i++)
        pthread_join(r[i], NULL);
    double secs = gst_now_s() - t_start;

    cr_assert_eq(atomic_load(&corruptions), 0,
                 "%lu corruptions in %lu updates; first: %s", atomic_load(&corruptions),
                 updates, first_error);
    cr_assert_geq(updates, updates_target);
    cr_assert_gt(atomic_load(&reads_checked), 0);

    /* Everything deferred is reclaimed: nothing leaks. */
    for (uint32_t i = 0; i < NSLOTS; i++)
        gs_free_rcu(slots[i]);
    for (int i = 0; i < 50; i++) {
        gs_reclaim(SIZE_MAX);
        gs_stats_get(&st1);
        if (!st1.pending_objects)
            break;
    }
    cr_assert_eq(st1.pending_objects, 0, "%zu objects still pending after gs_reclaim",
                 st1.pending_objects);
    cr_assert_eq(st1.pending_bytes, 0);
    cr_assert_geq(st1.reclaimed_objects - st0.reclaimed_objects, updates + NSLOTS,
                  "reclaimed %zu objects, deferred %lu",
                  st1.reclaimed_objects - st0.reclaimed_objects, updates + NSLOTS);
    cr_log_info("%lu updates, %lu object checks, %.2f s on %d CPUs, %lu grace periods", updates,
                atomic_load(&reads_checked), secs, ncpu,
                st1.gp_completed - st0.gp_completed);
}
