/*
 * Memory bound of deferred free: the replace-and-defer workload of the
 * brief (4096 slots x 64 B; 1 reader + 1 writer, then 2 writers and no
 * reader) runs several million updates, and
 *   - the peak RSS (VmHWM) grows by at most the live set + 8 MiB over its
 *     value before the loop;
 *   - gs_stats pending_bytes, sampled during the run, stays under 8 MiB.
 * No timing assertion. Length: GS_TORTURE_UPDATES per phase (default 10
 * million), at least GS_TORTURE_SECONDS if set.
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

static void *monitor(void *arg)
{
    size_t *max_pending = arg;
    while (!atomic_load_explicit(&stop_all, memory_order_relaxed)) {
        struct gs_stats st;
        gs_stats_get(&st);
        if (st.pending_bytes > *max_pending)
            *max_pending = st.pending_bytes;
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
    struct gs_stats st;
    gs_stats_get(&st);
    cr_log_info("%u writer(s), %u reader(s): %lu updates in %.2f s; peak RSS +%zu KiB "
                "(live %zu KiB, peak reset %s); max pending %zu KiB; %lu grace periods",
                writers, readers, atomic_load(&updates_done), secs, (hwm - hwm0) >> 10,
                live >> 10, reset ? "yes" : "no", max_pending >> 10, st.gp_completed);
    cr_assert_eq(atomic_load(&bad_reads), 0, "readers saw %lu reused objects",
                 atomic_load(&bad_reads));
    cr_assert_geq(atomic_load(&updates_done), target);
    cr_assert_leq(hwm - hwm0, live + SLACK,
                  "peak RSS grew by %zu KiB for a live set of %zu KiB (bound: live + 8 MiB)",
                  (hwm - hwm0) >> 10, live >> 10);
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
