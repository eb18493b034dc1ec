/*
 * Memory bound of deferred free: the replace-and-defer workload of the
 * brief (4096 slots x 64 B; 1 reader + 1 writer, then 2 writers and no
 * reader) runs several million updates, and
 *   - the peak RSS (VmHWM) grows by at most the live set + 8 MiB over its
 *     value before the loop;
 *   - gs_stats pending_bytes, sampled during the run, stays under 8 MiB.
 * Then writers that do everything inside short read-side sections, more of
 * them than CPUs: they can never wait for a grace period themselves, and a
 * reader preempted inside its section holds each one open for a time
 * slice. Their footprint is the allocation rate times the grace-period
 * latency, whatever the machine; what must hold is that it stops growing:
 * in the second half of the run (13 s here), the peak RSS grows by at most
 * 16 MiB.
 * No timing assertion. Length: GS_TORTURE_UPDATES per phase (default 10
 * million; 320 million for the last), at least GS_TORTURE_SECONDS if set.
 */
#include "include/graceslab.h"
#include "tests/stress/pending_common.h"

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdatomic.h>

#define NSLOTS 4096
#define OBJ 64
#define SLACK ((size_t)8 << 20)

struct obj {
    uint64_t key, nkey;
    char pad[OBJ - 16];
};

static struct obj *slots[NSLOTS];
static _Atomic bool stop_all, stop_writers;
static _Atomic unsigned long updates_done, bad_reads;
static unsigned long target;
static double min_seconds, t0;
static unsigned nwriters;

static struct obj *make(uint64_t key)
{
    struct obj *o = gs_malloc(OBJ);
    if (!o)
        abort(); /* threads cannot cr_assert: the crash is the failure */
    o->key = key;
    o->nkey = ~key;
    return o;
}

static void *writer(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    uint64_t rng = 99 + id, key = (uint64_t)id << 48;
    while (!atomic_load_explicit(&stop_writers, memory_order_relaxed)) {
        for (int k = 0; k < 256; k++) {
            uint32_t slot = (uint32_t)(gst_rand(&rng) % (NSLOTS / nwriters)) * nwriters + id;
            struct obj *old = slots[slot];
            gs_rcu_assign_pointer(slots[slot], make(++key));
            gs_free_rcu(old);
        }
        unsigned long n = atomic_fetch_add_explicit(&updates_done, 256, memory_order_relaxed);
        if (n + 256 >= target && gst_now_s() - t0 >= min_seconds)
            atomic_store(&stop_writers, true);
    }
    return NULL;
}

static void *reader(void *arg)
{
    (void)arg;
    uint64_t rng = 7;
    while (!atomic_load_explicit(&stop_all, memory_order_relaxed)) {
        gs_rcu_read_lock();
        for (int i = 0; i < 8; i++) {
            const volatile struct obj *o = gs_rcu_dereference(slots[gst_rand(&rng) % NSLOTS]);
            if (o->nkey != ~o->key)
                atomic_fetch_add(&bad_reads, 1);
        }
        gs_rcu_read_unlock();
    }
    return NULL;
}

/* The highest mapped_bytes the monitor saw (each test is a process). */
static size_t max_mapped;

static void *monitor(void *arg)
{
    size_t *max_pending = arg;
    while (!atomic_load_explicit(&stop_all, memory_order_relaxed)) {
        struct gs_stats st;
        gs_stats_get(&st);
        if (st.pending_bytes > *max_pending)
            *max_pending = st.pending_bytes;
        if (st.mapped_bytes > max_mapped)
            max_mapped = st.mapped_bytes;
        gst_sleep_ms(2);
    }
    return NULL;
}

static void run(unsigned writers, unsigned readers)
{
    target = gsp_updates(10000000);
    min_seconds = gsp_seconds();
    nwriters = writers;
    gs_reclaim(SIZE_MAX);
    bool reset = gsp_reset_peak_rss();
    size_t hwm0 = gsp_status_bytes("VmHWM");
    cr_assert_gt(hwm0, 0, "no VmHWM in /proc/self/status");

    size_t live = 0;
    for (uint32_t i = 0; i < NSLOTS; i++) {
        slots[i] = make(i);
        live += gs_usable_size(slots[i]);
    }
    size_t max_pending = 0;
    pthread_t w[2], r[1], m;
    t0 = gst_now_s();
    cr_assert_eq(pthread_create(&m, NULL, monitor, &max_pending), 0);
    for (uintptr_t i = 0; i < readers; i++)
        cr_assert_eq(pthread_create(&r[i], NULL, reader, NULL), 0);
    for (uintptr_t i = 0; i < writers; i++)
        cr_assert_eq(pthread_create(&w[i], NULL, writer, (void *)i), 0);
    for (unsigned i = 0; i < writers; i++)
        pthread_join(w[i], NULL);
    atomic_store(&stop_all, true);
    for (unsigned i = 0; i < readers; i++)
        pthread_join(r[i], NULL);
    pthread_join(m, NULL);
    double secs = gst_now_s() - t0;

    size_t hwm = gsp_status_bytes("VmHWM");
    size_t grew = hwm > hwm0 ? hwm - hwm0 : 0; /* see writers_inside_read_sections */
    struct gs_stats st;
    gs_stats_get(&st);
    cr_log_info("%u writer(s), %u reader(s): %lu updates in %.2f s; peak RSS +%zu KiB "
                "(live %zu KiB, peak reset %s); max pending %zu KiB; %lu grace periods",
                writers, readers, atomic_load(&updates_done), secs, grew >> 10,
                live >> 10, reset ? "yes" : "no", max_pending >> 10, st.gp_completed);
    cr_assert_eq(atomic_load(&bad_reads), 0, "readers saw %lu reused objects",
                 atomic_load(&bad_reads));
    cr_assert_geq(atomic_load(&updates_done), target);
    cr_assert_leq(grew, live + SLACK,
                  "peak RSS grew by %zu KiB for a live set of %zu KiB (bound: live + 8 MiB)",
                  grew >> 10, live >> 10);
    cr_assert_leq(max_pending, SLACK, "pending_bytes reached %zu KiB", max_pending >> 10);
    cr_assert_gt(max_pending, 0, "the monitor never saw pending memory");

    for (uint32_t i = 0; i < NSLOTS; i++)
        gs_free_rcu(slots[i]);
    gs_reclaim(SIZE_MAX);
    gs_stats_get(&st);
    cr_assert_eq(st.pending_objects, 0);
}

Test(pending_membound, one_reader_one_writer, .timeout = 900)
{
    run(1, 1);
}

Test(pending_membound, two_writers_no_reader, .timeout = 900)
{
    run(2, 0);
}

/* ---- writers inside read-side sections -------------------------------- */

#define INREADER_WRITERS 8
/* Growth allowed in the second half. Measured (2 CPUs, 13 s halves): 0.3
   to 7.4 MiB here (9 runs); 29 to 39 MiB before the lazy thread drove
   grace periods for such writers. Other processes that take the CPUs
   from half-way raise the grace-period latency, and the footprint with
   it: this can then fail (docs/reliability.md). On the thirty-eighth
   session's host it failed quiet too, once in 4 to 5 runs (+25 to +28
   MiB), until refills that could not wait inside a section left the wait
   to its unlock: 1.0 to 3.8 MiB in 19 quiet runs since, 21 to 25 MiB with
   two CPU-bound processes from half-way. */
#define INREADER_SLACK ((size_t)16 << 20)

static _Atomic size_t half_hwm; /* VmHWM when half was done (0: not yet) */

static void *writer_in_reader(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    uint64_t rng = 31 + id, key = (uint64_t)(id + 8) << 48;
    while (!atomic_load_explicit(&stop_writers, memory_order_relaxed)) {
        for (int k = 0; k < 256; k++) {
            uint32_t slot = (uint32_t)(gst_rand(&rng) % NSLOTS);
            gs_rcu_read_lock();
            struct obj *n = make(++key);
            struct obj *old = __atomic_exchange_n(&slots[slot], n, __ATOMIC_ACQ_REL);
            /* Deferred by another writer's section at the earliest, so it
               must still be intact here. */
            if (old->nkey != ~old->key)
                atomic_fetch_add(&bad_reads, 1);
            gs_free_rcu(old);
            gs_rcu_read_unlock();
        }
        unsigned long n = atomic_fetch_add_explicit(&updates_done, 256, memory_order_relaxed);
        if (n < target / 2 && n + 256 >= target / 2)
            atomic_store(&half_hwm, gsp_status_bytes("VmHWM"));
        if (n + 256 >= target && gst_now_s() - t0 >= min_seconds)
            atomic_store(&stop_writers, true);
    }
    return NULL;
}

Test(pending_membound, writers_inside_read_sections, .timeout = 900)
{
    /* Eight writers on at most two CPUs: the grace periods wait for
       preempted readers, as on any machine with more threads than CPUs. */
    int cpus = gsp_limit_cpus(2);
    target = gsp_updates(320000000);
    min_seconds = gsp_seconds();
    for (uint32_t i = 0; i < NSLOTS; i++)
        slots[i] = make(i);
    bool reset = gsp_reset_peak_rss();
    size_t hwm0 = gsp_status_bytes("VmHWM");
    pthread_t w[INREADER_WRITERS];
    t0 = gst_now_s();
    for (uintptr_t i = 0; i < INREADER_WRITERS; i++)
        cr_assert_eq(pthread_create(&w[i], NULL, writer_in_reader, (void *)i), 0);
    for (unsigned i = 0; i < INREADER_WRITERS; i++)
        pthread_join(w[i], NULL);
    double secs = gst_now_s() - t0;
    size_t hwm = gsp_status_bytes("VmHWM"), half = atomic_load(&half_hwm);
    /* VmHWM is the larger of the kernel's recorded peak and the current
       RSS, and the recorded peak is updated lazily: a later reading can be
       a little lower (144 KiB in one ASan run) when the RSS fell since.
       That is no growth. */
    size_t grew = hwm > half ? hwm - half : 0, first = half > hwm0 ? half - hwm0 : 0;
    struct gs_stats st;
    gs_stats_get(&st);
    cr_log_info("%d writers inside read-side sections on %d CPUs: %lu updates in %.2f s; "
                "peak RSS +%zu KiB in the second half, +%zu KiB in all (peak reset %s); "
                "%lu grace periods",
                INREADER_WRITERS, cpus, atomic_load(&updates_done), secs, grew >> 10,
                (grew + first) >> 10, reset ? "yes" : "no", st.gp_completed);
    cr_assert_eq(atomic_load(&bad_reads), 0, "writers saw %lu reused objects",
                 atomic_load(&bad_reads));
    cr_assert_gt(half, 0, "the half-way point was never recorded");
    cr_assert_leq(grew, INREADER_SLACK,
                  "peak RSS grew by %zu KiB in the second half of the run "
                  "(+%zu KiB in the first); bound: 16 MiB",
                  grew >> 10, first >> 10);

    for (uint32_t i = 0; i < NSLOTS; i++)
        gs_free_rcu(slots[i]);
    gs_reclaim(SIZE_MAX);
    gs_stats_get(&st);
    cr_assert_eq(st.pending_objects, 0);
}

/* ---- large and medium blocks deferred inside read-side sections -------- */

#define LARGE_SLOTS 256
/* Pending blocks allowed at once: 4096 (256 MiB of the 64 KiB blocks this
   test used while those were large blocks; measured then 43 to 57 MiB). */
#define BOUND_BLOCKS 4096
static size_t large_size; /* of the test running */

static void *large_slots[LARGE_SLOTS];

static void *large_writer_in_reader(void *arg)
{
    uint64_t rng = 77 + (uintptr_t)arg;
    while (!atomic_load_explicit(&stop_writers, memory_order_relaxed)) {
        uint32_t slot = (uint32_t)(gst_rand(&rng) % LARGE_SLOTS);
        gs_rcu_read_lock();
        uint64_t *n = gs_malloc(large_size);
        if (!n)
            abort();
        n[0] = slot;
        n[1] = ~(uint64_t)slot;
        uint64_t *old = __atomic_exchange_n(&large_slots[slot], n, __ATOMIC_ACQ_REL);
        if (old[1] != ~old[0])
            atomic_fetch_add(&bad_reads, 1);
        gs_free_rcu(old);
        gs_rcu_read_unlock();
        unsigned long done = atomic_fetch_add_explicit(&updates_done, 1, memory_order_relaxed);
        if (done + 1 >= target && gst_now_s() - t0 >= min_seconds)
            atomic_store(&stop_writers, true);
    }
    return NULL;
}

static void blocks_inside_read_sections(size_t size)
{
    large_size = size;
    int cpus = gsp_limit_cpus(2);
    target = gsp_updates(10000000) / 100; /* 100,000 by default */
    min_seconds = gsp_seconds();
    for (uint32_t i = 0; i < LARGE_SLOTS; i++) {
        uint64_t *b = gs_malloc(large_size);
        cr_assert_not_null(b);
        b[0] = i;
        b[1] = ~(uint64_t)i;
        large_slots[i] = b;
    }
    size_t max_pending = 0;
    pthread_t w[INREADER_WRITERS / 2], m;
    t0 = gst_now_s();
    cr_assert_eq(pthread_create(&m, NULL, monitor, &max_pending), 0);
    for (uintptr_t i = 0; i < INREADER_WRITERS / 2; i++)
        cr_assert_eq(pthread_create(&w[i], NULL, large_writer_in_reader, (void *)i), 0);
    for (unsigned i = 0; i < INREADER_WRITERS / 2; i++)
        pthread_join(w[i], NULL);
    atomic_store(&stop_all, true);
    pthread_join(m, NULL);
    struct gs_stats st;
    gs_stats_get(&st);
    cr_log_info("%d writers of %zu KiB blocks inside read-side sections on %d CPUs: "
                "%lu updates in %.2f s; max pending %zu KiB; %lu grace periods",
                INREADER_WRITERS / 2, large_size >> 10, cpus, atomic_load(&updates_done),
                gst_now_s() - t0, max_pending >> 10, st.gp_completed);
    cr_assert_eq(atomic_load(&bad_reads), 0, "writers saw %lu reused blocks",
                 atomic_load(&bad_reads));
    cr_assert_leq(max_pending, BOUND_BLOCKS * large_size,
                  "pending_bytes reached %zu MiB (bound: %d blocks, %zu MiB)", max_pending >> 20,
                  BOUND_BLOCKS, BOUND_BLOCKS * large_size >> 20);

    for (uint32_t i = 0; i < LARGE_SLOTS; i++)
        gs_free_rcu(large_slots[i]);
    gs_reclaim(SIZE_MAX);
    gs_stats_get(&st);
    cr_assert_eq(st.pending_objects, 0);
}

/* Large blocks have no slab refill: the large allocation path reclaims
   them, and past the pending bound waits for a grace period, but never
   inside a reader. There, nothing drove grace periods at all: not one
   completed, and every deferred block stayed mapped (34,000 blocks, 2 GiB
   of address space, in 20 s). 320 KiB: above the slab classes. */
Test(pending_membound, large_blocks_inside_read_sections, .timeout = 900)
{
    blocks_inside_read_sections((size_t)320 << 10);
}

/* The same with 64 KiB blocks, a medium slab class: their slabs' refill
   reclaims them. The writers replace blocks ten times as fast as with
   large blocks (no mapping per block), so more bytes are deferred per
   grace period. */
Test(pending_membound, medium_blocks_inside_read_sections, .timeout = 900)
{
    blocks_inside_read_sections((size_t)64 << 10);
}

/* ---- a producer inside read-side sections, a consumer that defers ------ */

#define RING 4096
#define HANDOFF_BOUND ((size_t)32 << 20)

static struct obj *ring[RING];
static _Atomic unsigned long ring_head, ring_tail;

/* Allocates the objects the consumer takes; arg non-NULL: each inside a
   read-side section. */
static void *producer(void *arg)
{
    for (uint64_t key = 1; key <= target; key++) {
        unsigned long h = atomic_load_explicit(&ring_head, memory_order_relaxed);
        while (h - atomic_load_explicit(&ring_tail, memory_order_acquire) >= RING)
            sched_yield();
        if (arg)
            gs_rcu_read_lock();
        struct obj *o = make(key);
        if (arg)
            gs_rcu_read_unlock();
        ring[h % RING] = o;
        /* Release: the object's contents before the consumer sees it. */
        atomic_store_explicit(&ring_head, h + 1, memory_order_release);
    }
    return NULL;
}

/* Defers what the producer allocated. arg non-NULL: also keeps one object
   of the same class of its own, replaced every 100,000 frees (it has an
   active slab of the class but hardly ever refills). */
static void *consumer_defers(void *arg)
{
    struct obj *mine = arg ? make(0) : NULL;
    for (unsigned long t = 0; t < target; t++) {
        while (atomic_load_explicit(&ring_head, memory_order_acquire) == t)
            sched_yield();
        struct obj *o = ring[t % RING];
        atomic_store_explicit(&ring_tail, t + 1, memory_order_release);
        if (o->key != t + 1 || o->nkey != ~o->key)
            atomic_fetch_add(&bad_reads, 1);
        gs_free_rcu(o);
        if (mine && t % 100000 == 0) {
            gs_free(mine);
            mine = make(0);
        }
        atomic_fetch_add_explicit(&updates_done, 1, memory_order_relaxed);
    }
    if (mine)
        gs_free(mine);
    return NULL;
}

/* A thread that allocates inside read-side sections what another thread
   defers (and never allocates): the deferred objects' slabs are ownerless,
   and only a sweep hands them back. Inside a reader the producer cannot
   wait for a grace period; it used to leave them to the lazy sweep, about
   once a second (up to 140 MiB pending here, 2.2 million objects). */
Test(pending_membound, producer_inside_read_sections, .timeout = 900)
{
    int cpus = gsp_limit_cpus(2);
    target = gsp_updates(10000000);
    size_t max_pending = 0;
    pthread_t p, c, m;
    t0 = gst_now_s();
    cr_assert_eq(pthread_create(&m, NULL, monitor, &max_pending), 0);
    cr_assert_eq(pthread_create(&c, NULL, consumer_defers, NULL), 0);
    cr_assert_eq(pthread_create(&p, NULL, producer, (void *)1), 0);
    pthread_join(p, NULL);
    pthread_join(c, NULL);
    atomic_store(&stop_all, true);
    pthread_join(m, NULL);
    struct gs_stats st;
    gs_stats_get(&st);
    cr_log_info("producer inside read-side sections, consumer deferring, %d CPUs: %lu objects "
                "in %.2f s; max pending %zu KiB; %lu grace periods",
                cpus, atomic_load(&updates_done), gst_now_s() - t0, max_pending >> 10,
                st.gp_completed);
    cr_assert_eq(atomic_load(&bad_reads), 0, "the consumer saw %lu corrupt objects",
                 atomic_load(&bad_reads));
    cr_assert_eq(atomic_load(&updates_done), target);
    cr_assert_leq(max_pending, HANDOFF_BOUND, "pending_bytes reached %zu MiB (bound: 32 MiB)",
                  max_pending >> 20);
    gs_reclaim(SIZE_MAX);
    gs_stats_get(&st);
    cr_assert_eq(st.pending_objects, 0);
}

/* ---- the consumer also allocates a little of the same class ------------ */

/* The consumer used to adopt every full slab it deferred into (it has an
   active slab of the class), so they waited on its lists for refills that
   hardly ever came, full of reclaimable objects, while the producer mapped
   new ones: 1.1 GB mapped for 40 M handoffs of 64 B objects (the review
   helper's reproducer), 260 MiB in this test; now 4.4 MiB. */
Test(pending_membound, consumer_allocating_a_little, .timeout = 900)
{
    int cpus = gsp_limit_cpus(2);
    target = gsp_updates(10000000);
    size_t max_pending = 0;
    struct gs_stats st;
    gs_reclaim(SIZE_MAX);
    gs_stats_get(&st);
    size_t mapped0 = st.mapped_bytes;
    pthread_t p, c, m;
    t0 = gst_now_s();
    cr_assert_eq(pthread_create(&m, NULL, monitor, &max_pending), 0);
    cr_assert_eq(pthread_create(&c, NULL, consumer_defers, (void *)1), 0);
    cr_assert_eq(pthread_create(&p, NULL, producer, NULL), 0);
    pthread_join(p, NULL);
    pthread_join(c, NULL);
    atomic_store(&stop_all, true);
    pthread_join(m, NULL);
    gs_stats_get(&st);
    cr_log_info("producer, consumer deferring and allocating a little, %d CPUs: %lu objects in "
                "%.2f s; mapped %zu KiB at the start, at most %zu KiB; %lu grace periods",
                cpus, atomic_load(&updates_done), gst_now_s() - t0, mapped0 >> 10,
                max_mapped >> 10, st.gp_completed);
    cr_assert_eq(atomic_load(&bad_reads), 0, "the consumer saw %lu corrupt objects",
                 atomic_load(&bad_reads));
    cr_assert_eq(atomic_load(&updates_done), target);
    cr_assert_leq(max_mapped, mapped0 + HANDOFF_BOUND,
                  "mapped grew from %zu to %zu MiB (bound: 32 MiB more)", mapped0 >> 20,
                  max_mapped >> 20);
    gs_reclaim(SIZE_MAX);
    gs_stats_get(&st);
    cr_assert_eq(st.pending_objects, 0);
}
