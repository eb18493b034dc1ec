/*
 * Dedicated caches (gs_cache_*), against the contracts of graceslab.h:
 * create/alloc/free/destroy, argument checks, alignment, deferred free with
 * gs_cache_free_rcu, GS_CACHE_TYPESAFE_BY_RCU (immediate reuse within the
 * cache, but the memory stays an object of the cache while a reader may
 * hold it), destroy (aborts with live objects, waits for pending ones),
 * calls inside read-side sections, and bad input.
 */
#include "include/graceslab.h"
#include "tests/common.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------- basics */

Test(cache, create_alloc_free_destroy)
{
    char name[64];
    strcpy(name, "test-objects-with-a-name-longer-than-31-bytes");
    struct gs_cache *c = gs_cache_create(name, 100, 0, 0);
    cr_assert_not_null(c);
    memset(name, 'X', sizeof name - 1); /* the name was copied */
    enum { N = 5000 };
    static unsigned char *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = gs_cache_alloc(c);
        cr_assert_not_null(p[i]);
        cr_assert_eq((uintptr_t)p[i] & 15, 0, "default alignment is 16: %p", (void *)p[i]);
        cr_assert_geq(gs_usable_size(p[i]), 100);
        gst_fill(p[i], 100, (uintptr_t)i);
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(gst_check(p[i], 100, (uintptr_t)i), 100, "object %d overlaps another", i);
    for (int i = 0; i < N; i += 2)
        gs_cache_free(c, p[i]);
    for (int i = 0; i < N; i += 2) {
        p[i] = gs_cache_alloc(c); /* reuse */
        cr_assert_not_null(p[i]);
        gst_fill(p[i], 100, (uintptr_t)i);
    }
    for (int i = 0; i < N; i++) {
        cr_assert_eq(gst_check(p[i], 100, (uintptr_t)i), 100);
        gs_cache_free(c, p[i]);
    }
    gs_cache_destroy(c);
    /* A new cache after a destroy works as well. */
    c = gs_cache_create("again", 24, 0, 0);
    cr_assert_not_null(c);
    void *q = gs_cache_alloc(c);
    cr_assert_not_null(q);
    gs_cache_free(c, q);
    gs_cache_destroy(c);
}

Test(cache, bad_arguments_einval)
{
    static const size_t bad_align[] = {3, 24, 65536, 1 << 20};
    for (size_t i = 0; i < sizeof bad_align / sizeof bad_align[0]; i++) {
        errno = 0;
        cr_assert_null(gs_cache_create("bad", 64, bad_align[i], 0), "align %zu accepted",
                       bad_align[i]);
        cr_assert_eq(errno, EINVAL, "align %zu: errno %d", bad_align[i], errno);
    }
}

Test(cache, alignment_honoured)
{
    static const size_t sizes[] = {1, 24, 100, 1000, 4000, 5000};
    for (size_t a = 16; a <= 32768; a *= 2)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            struct gs_cache *c = gs_cache_create("aligned", sizes[s], a, 0);
            cr_assert_not_null(c, "size %zu align %zu", sizes[s], a);
            void *p[300];
            for (int i = 0; i < 300; i++) {
                p[i] = gs_cache_alloc(c);
                cr_assert_not_null(p[i]);
                cr_assert_eq((uintptr_t)p[i] & (a - 1), 0, "size %zu align %zu: %p", sizes[s],
                             a, p[i]);
                memset(p[i], 0xA5, sizes[s]);
            }
            for (int i = 0; i < 300; i++)
                gs_cache_free(c, p[i]);
            gs_cache_destroy(c);
        }
}

/* ------------------------------------------------------ gs_cache_free_rcu */

Test(cache, free_rcu_defers_until_grace_period)
{
    enum { N = 2000, SZ = 72 };
    struct gs_cache *c = gs_cache_create("deferred", SZ, 0, 0);
    cr_assert_not_null(c);
    while (gs_reclaim(SIZE_MAX))
        ;
    static unsigned char *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = gs_cache_alloc(c);
        cr_assert_not_null(p[i]);
        gst_fill(p[i], SZ, (uintptr_t)i + 1);
    }
    struct gs_stats st0, st1, st2;
    gs_stats_get(&st0);
    gs_rcu_read_lock();
    for (int i = 0; i < N; i++)
        gs_cache_free_rcu(c, p[i]);
    gs_stats_get(&st1);
    cr_assert_eq(st1.pending_objects, st0.pending_objects + N);
    /* Inside the section: new objects are never the deferred ones, and the
       deferred ones keep their contents. */
    for (int k = 0; k < 3 * N; k++) {
        unsigned char *q = gs_cache_alloc(c);
        cr_assert_not_null(q);
        memset(q, 0xEE, SZ);
        for (int i = 0; i < N; i += 97)
            cr_assert_neq(q, p[i], "a deferred object was handed out inside its reader");
        gs_cache_free(c, q);
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(gst_check(p[i], SZ, (uintptr_t)i + 1), SZ,
                     "deferred object %d written before its grace period", i);
    gs_rcu_read_unlock();
    /* The allocations above kicked the engine's background thread, which
       may sweep some of them before or while gs_reclaim does (its bytes
       are not in gs_reclaim's return): the statistics count every sweep. */
    gs_reclaim(SIZE_MAX);
    gs_stats_get(&st2);
    cr_assert_eq(st2.pending_objects, 0);
    cr_assert_geq(st2.reclaimed_objects - st1.reclaimed_objects, N);
    gs_cache_destroy(c);
}

/* ------------------------------------------------ GS_CACHE_TYPESAFE_BY_RCU */

#define TAG 0x7479706573616665ull /* "typesafe" */
#define TS_SIZE 96

struct tobj {
    uint64_t tag;
    _Atomic uint64_t key;
    char pad[TS_SIZE - 16];
};

Test(typesafe, free_makes_object_reusable_at_once)
{
    struct gs_cache *c = gs_cache_create("typesafe", TS_SIZE, 0, GS_CACHE_TYPESAFE_BY_RCU);
    cr_assert_not_null(c);
    void *keep = gs_cache_alloc(c);
    gs_rcu_read_lock(); /* even a reader does not delay the reuse */
    void *p = gs_cache_alloc(c);
    cr_assert_not_null(p);
    gs_cache_free(c, p);
    bool reused = false;
    void *q[64];
    for (int i = 0; i < 64; i++) {
        q[i] = gs_cache_alloc(c);
        reused |= q[i] == p;
    }
    gs_rcu_read_unlock();
    cr_assert(reused, "an object freed with gs_cache_free was not reused by its cache");
    for (int i = 0; i < 64; i++)
        gs_cache_free(c, q[i]);
    gs_cache_free(c, keep);
    gs_cache_destroy(c);
}

/* One thread: a reader holds pointers to every object of the cache, all of
   them are freed (the slabs become empty), and the process allocates heavily
   elsewhere. Until the unlock, the memory must still be this cache's. */
Test(typesafe, memory_stays_the_cache_type_while_read)
{
    enum { N = 20000 };
    struct gs_cache *c = gs_cache_create("typesafe", TS_SIZE, 0, GS_CACHE_TYPESAFE_BY_RCU);
    cr_assert_not_null(c);
    static struct tobj *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = gs_cache_alloc(c);
        cr_assert_not_null(p[i]);
        p[i]->tag = TAG;
    }
    gs_rcu_read_lock();
    for (int i = 0; i < N; i++)
        gs_cache_free(c, p[i]);
    /* Traffic of the same size and others; memory the cache gave back must
       not be part of it yet. */
    static void *m[N];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            size_t sz = i & 1 ? TS_SIZE : 16u << (i % 8);
            m[i] = gs_malloc(sz);
            cr_assert_not_null(m[i]);
            memset(m[i], 0xEE, sz);
        }
        for (int i = 0; i < N; i++)
            gs_free(m[i]);
        gs_reclaim(SIZE_MAX); /* only polls in here */
        for (int i = 0; i < N; i++)
            cr_assert_eq(p[i]->tag, TAG, "object %d (%p) is no longer of its cache", i,
                         (void *)p[i]);
    }
    gs_rcu_read_unlock();
    gs_cache_destroy(c);
}

static struct gs_cache *ts_cache;
static struct tobj *ts_slots[256];
static _Atomic bool ts_stop;
static _Atomic unsigned long ts_bad, ts_reads, ts_reused;

static void *ts_writer(void *arg)
{
    uint64_t rng = 17 + (uintptr_t)arg, key = (uint64_t)(uintptr_t)arg << 40;
    unsigned id = (unsigned)(uintptr_t)arg;
    while (!atomic_load_explicit(&ts_stop, memory_order_relaxed)) {
        unsigned s = (unsigned)(gst_rand(&rng) % 128) * 2 + id;
        struct tobj *o = gs_cache_alloc(ts_cache);
        if (!o)
            abort();
        o->tag = TAG;
        atomic_store_explicit(&o->key, ++key, memory_order_relaxed);
        struct tobj *old = ts_slots[s];
        gs_rcu_assign_pointer(ts_slots[s], o);
        gs_cache_free(ts_cache, old); /* at once: typesafe */
        /* Churn of the same size outside the cache. */
        void *x = gs_malloc(TS_SIZE);
        if (!x)
            abort();
        memset(x, 0xEE, TS_SIZE);
        gs_free(x);
    }
    return NULL;
}

static void *ts_reader(void *arg)
{
    uint64_t rng = 1000 + (uintptr_t)arg;
    unsigned long reads = 0, reused = 0;
    while (!atomic_load_explicit(&ts_stop, memory_order_relaxed)) {
        gs_rcu_read_lock();
        const volatile struct tobj *o = gs_rcu_dereference(ts_slots[gst_rand(&rng) % 256]);
        uint64_t k0 = atomic_load_explicit(&((struct tobj *)o)->key, memory_order_relaxed);
        for (int i = 0; i < 50; i++) {
            if (o->tag != TAG)
                atomic_fetch_add(&ts_bad, 1);
            if (i == 25)
                sched_yield();
        }
        if (atomic_load_explicit(&((struct tobj *)o)->key, memory_order_relaxed) != k0)
            reused++; /* allowed: a different object of the same type */
        gs_rcu_read_unlock();
        reads++;
    }
    atomic_fetch_add(&ts_reads, reads);
    atomic_fetch_add(&ts_reused, reused);
    return NULL;
}

Test(typesafe, readers_always_see_an_object_of_the_cache, .timeout = 120)
{
    ts_cache = gs_cache_create("typesafe-mt", TS_SIZE, 0, GS_CACHE_TYPESAFE_BY_RCU);
    cr_assert_not_null(ts_cache);
    for (int i = 0; i < 256; i++) {
        ts_slots[i] = gs_cache_alloc(ts_cache);
        ts_slots[i]->tag = TAG;
        ts_slots[i]->key = 0;
    }
    pthread_t w[2], r[2];
    for (uintptr_t i = 0; i < 2; i++) {
        cr_assert_eq(pthread_create(&w[i], NULL, ts_writer, (void *)i), 0);
        cr_assert_eq(pthread_create(&r[i], NULL, ts_reader, (void *)i), 0);
    }
    gst_sleep_ms(1500);
    atomic_store(&ts_stop, true);
    for (int i = 0; i < 2; i++) {
        pthread_join(w[i], NULL);
        pthread_join(r[i], NULL);
    }
    cr_assert_eq(atomic_load(&ts_bad), 0, "readers saw memory of another type %lu times",
                 atomic_load(&ts_bad));
    cr_assert_gt(atomic_load(&ts_reads), 0);
    cr_log_info("%lu reads, %lu saw the object replaced by another of the cache",
                atomic_load(&ts_reads), atomic_load(&ts_reused));
    for (int i = 0; i < 256; i++)
        gs_cache_free(ts_cache, ts_slots[i]);
    gs_cache_destroy(ts_cache);
}

/* ---------------------------------------------------------------- destroy */

static struct gs_cache *d_cache;
static unsigned char *d_obj[100];
static _Atomic int d_state; /* 1: reader inside, 2: reader done checking */

static void *destroy_reader(void *arg)
{
    (void)arg;
    gs_rcu_read_lock();
    atomic_store(&d_state, 1);
    gst_sleep_ms(300);
    bool intact = true;
    for (int i = 0; i < 100; i++)
        intact &= gst_check(d_obj[i], 64, (uintptr_t)i) == 64;
    atomic_store(&d_state, intact ? 2 : 3);
    gs_rcu_read_unlock();
    return NULL;
}

Test(destroy, waits_for_pending_objects, .timeout = 60)
{
    d_cache = gs_cache_create("destroy-wait", 64, 0, 0);
    cr_assert_not_null(d_cache);
    for (int i = 0; i < 100; i++) {
        d_obj[i] = gs_cache_alloc(d_cache);
        gst_fill(d_obj[i], 64, (uintptr_t)i);
    }
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, destroy_reader, NULL), 0);
    while (atomic_load(&d_state) == 0)
        gst_sleep_ms(1);
    /* Deferred while the reader is inside: destroy must wait for it. */
    for (int i = 0; i < 100; i++)
        gs_cache_free_rcu(d_cache, d_obj[i]);
    gs_cache_destroy(d_cache);
    int s = atomic_load(&d_state);
    cr_assert_neq(s, 1, "gs_cache_destroy returned while a reader could still see its "
                        "pending objects");
    cr_assert_eq(s, 2, "pending objects were modified before the reader left");
    pthread_join(t, NULL);
    struct gs_stats st;
    gs_stats_get(&st);
    cr_assert_eq(st.pending_objects, 0, "%zu objects pending after destroy",
                 st.pending_objects);
}

/* A plain gs_free() of a cache object, as graceslab.h allows, from a thread
   other than the one that destroys the cache and still alive then. Such a
   free used to wait in the freeing thread's batch of remote frees, where
   destroy could not see it: it aborted "destroying cache with live
   objects" (every run), and a later flush would have pushed onto a
   retired slab. */
static struct gs_cache *pf_cache;
static void *pf_obj[1000];
static _Atomic int pf_state;
static void *plain_free_and_wait(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++)
        gs_free(pf_obj[i]); /* free() itself in the preloaded and static builds */
    atomic_store(&pf_state, 1);
    while (atomic_load(&pf_state) != 2)
        gst_sleep_ms(1);
    return NULL;
}

Test(destroy, after_plain_frees_from_a_live_thread, .timeout = 60)
{
    pf_cache = gs_cache_create("plain-free", 40, 0, 0);
    cr_assert_not_null(pf_cache);
    for (int i = 0; i < 1000; i++)
        cr_assert_not_null(pf_obj[i] = gs_cache_alloc(pf_cache));
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, plain_free_and_wait, NULL), 0);
    while (atomic_load(&pf_state) != 1)
        gst_sleep_ms(1);
    gs_cache_destroy(pf_cache); /* aborts the test on a false "live objects" */
    atomic_store(&pf_state, 2);
    pthread_join(t, NULL);
    /* The same from the destroying thread itself. */
    struct gs_cache *c = gs_cache_create("plain-free-self", 40, 0, 0);
    cr_assert_not_null(c);
    gs_free(gs_cache_alloc(c));
    gs_cache_destroy(c);
}

/* A program that uses only a cache and gs_cache_free_rcu: nothing else
   drives grace periods (no malloc slow path runs), so the cache's own
   refill must, or pending objects pile up without bound. It used to map a
   new slab for every batch: 2,000,000 objects (128 MB) pending at the end,
   no grace period completed. */
Test(cache, free_rcu_alone_stays_bounded, .timeout = 120)
{
    struct gs_cache *c = gs_cache_create("rcu-only", 64, 0, 0);
    cr_assert_not_null(c);
    size_t most = 0;
    for (int i = 0; i < 2000000; i++) {
        void *p = gs_cache_alloc(c);
        cr_assert_not_null(p);
        gs_cache_free_rcu(c, p);
        if (i % 20000 == 0) {
            struct gs_stats st;
            gs_stats_get(&st);
            if (st.pending_objects > most)
                most = st.pending_objects;
        }
    }
    cr_assert_lt(most, 200000, "%zu objects pending at most (12.8 MB of 64 B)", most);
    gs_cache_destroy(c);
}

/* ------------------------------------------------------------------ fork */

/* Fork while other threads work on a cache: fork's prepare must take the
   cache's lock, or a child can inherit it held (and the cache's slab list
   half updated). The children used to hang in their first cache call
   (30 of 100 with two threads). Each child allocates and frees in the
   cache, and makes a thread that does too; SIGALRM ends a hung one. */
static struct gs_cache *fk_cache;
static _Atomic int fk_stop;
static void *fk_churn(void *arg)
{
    (void)arg;
    void *p[64];
    while (!atomic_load(&fk_stop)) {
        for (int i = 0; i < 64; i++)
            p[i] = gs_cache_alloc(fk_cache);
        for (int i = 0; i < 64; i++)
            gs_cache_free(fk_cache, p[i]);
    }
    return NULL;
}

static void *fk_child_thread(void *arg)
{
    (void)arg;
    void *p = gs_cache_alloc(fk_cache);
    if (p)
        gs_cache_free(fk_cache, p);
    return p;
}

Test(fork, while_threads_use_a_cache, .timeout = 120)
{
    fk_cache = gs_cache_create("forked", 48, 0, 0);
    cr_assert_not_null(fk_cache);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fk_churn, NULL), 0);
    int bad = 0, first_status = 0;
    for (int round = 0; round < 50; round++) {
        gst_sleep_ms(2);
        fflush(NULL);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            alarm(5);
            void *p = gs_cache_alloc(fk_cache);
            if (!p)
                _exit(2);
            gs_cache_free(fk_cache, p);
            pthread_t ct;
            void *got = NULL;
            if (pthread_create(&ct, NULL, fk_child_thread, NULL) != 0 ||
                pthread_join(ct, &got) != 0 || !got)
                _exit(3);
            _exit(0);
        }
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (!bad++)
                first_status = status;
        }
    }
    atomic_store(&fk_stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(bad, 0, "%d of 50 children failed (first: %s %d)", bad,
                 WIFSIGNALED(first_status) ? "signal" : "exit",
                 WIFSIGNALED(first_status) ? WTERMSIG(first_status) : WEXITSTATUS(first_status));
    gs_cache_destroy(fk_cache);
}

/* ------------------------------------------------------ inside a reader */

static void reader_cache_calls(void *arg)
{
    unsigned flags = (unsigned)(uintptr_t)arg;
    alarm(10);
    struct gs_cache *c = gs_cache_create("in-reader", 64, 0, flags);
    GST_CHILD_CHECK(c != NULL, "create");
    static void *p[100000];
    gs_rcu_read_lock();
    for (int i = 0; i < 100000; i++) {
        p[i] = gs_cache_alloc(c);
        GST_CHILD_CHECK(p[i] != NULL, "alloc %d", i);
    }
    for (int i = 0; i < 100000; i += 2)
        gs_cache_free_rcu(c, p[i]);
    for (int i = 1; i < 100000; i += 2)
        gs_cache_free(c, p[i]);
    for (int i = 0; i < 100000; i++) {
        p[i] = gs_cache_alloc(c); /* refills with lots pending in the reader */
        GST_CHILD_CHECK(p[i] != NULL, "alloc again %d", i);
    }
    for (int i = 0; i < 100000; i++)
        gs_cache_free(c, p[i]);
    gs_rcu_read_unlock();
    gs_cache_destroy(c);
}

/* Destroy while another thread sweeps (gs_reclaim in a loop, as the
   engine's lazy thread also does): a sweep may take a done chain of the
   cache's slabs just before destroy and push it onto the remote chain
   after destroy collected it. Destroy waits for running sweeps and
   collects again; it used to abort "destroying cache with live objects"
   (one run in three of 100 rounds; one in four of this test's 300 before
   it went to 1000) and could retire a slab under the push. */
static _Atomic int sweeping_stop;
static void *keep_sweeping(void *arg)
{
    (void)arg;
    while (!atomic_load(&sweeping_stop))
        gs_reclaim(SIZE_MAX);
    return NULL;
}

Test(destroy, while_another_thread_sweeps, .timeout = 120)
{
    enum { ROUNDS = 1000, N = 20000 };
    void **p = gst_raw_array(N);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, keep_sweeping, NULL), 0);
    for (int r = 0; r < ROUNDS; r++) {
        struct gs_cache *c = gs_cache_create("swept", 16, 0, 0);
        cr_assert_not_null(c);
        for (int i = 0; i < N; i++)
            cr_assert_not_null(p[i] = gs_cache_alloc(c));
        for (int i = 0; i < N; i++)
            gs_cache_free_rcu(c, p[i]);
        gs_cache_destroy(c); /* aborts the test on a false "live objects" */
    }
    atomic_store(&sweeping_stop, 1);
    pthread_join(t, NULL);
}

Test(in_reader, cache_calls_never_wait, .timeout = 60)
{
    struct gst_child c;
    cr_assert(gst_run_child(reader_cache_calls, (void *)(uintptr_t)0, &c));
    GST_ASSERT_CHILD_OK(&c, "cache calls in a reader");
}

Test(in_reader, typesafe_cache_calls_never_wait, .timeout = 60)
{
    struct gst_child c;
    cr_assert(gst_run_child(reader_cache_calls, (void *)(uintptr_t)GS_CACHE_TYPESAFE_BY_RCU, &c));
    GST_ASSERT_CHILD_OK(&c, "typesafe cache calls in a reader");
}

/* ------------------------------------------------------------- bad input */

enum bad_kind { WRONG_CACHE, MALLOC_POINTER, FREE_RCU_TWICE, FREE_AFTER_FREE_RCU, DESTROY_LIVE };

struct bad_case {
    enum bad_kind kind;
};

static void bad_child(void *arg)
{
    struct bad_case *bc = arg;
    struct gs_cache *a = gs_cache_create("cache-a", 64, 0, 0);
    struct gs_cache *b = gs_cache_create("cache-b", 64, 0, 0);
    void *keep = gs_cache_alloc(a);
    void *p = bc->kind == MALLOC_POINTER ? gs_malloc(64) : gs_cache_alloc(a);
    gst_child_report_ptr(p);
    switch (bc->kind) {
    case WRONG_CACHE:
        gs_cache_free(b, p);
        break;
    case MALLOC_POINTER:
        gs_cache_free(a, p);
        break;
    case FREE_RCU_TWICE:
        gs_cache_free_rcu(a, p);
        gs_cache_free_rcu(a, p);
        break;
    case FREE_AFTER_FREE_RCU:
        gs_cache_free_rcu(a, p);
        gs_cache_free(a, p);
        break;
    case DESTROY_LIVE:
        gs_cache_free(a, keep);
        gs_cache_destroy(a); /* p is still live */
        break;
    }
    /* Returning is the failure: the parent expects SIGABRT. */
}

/* The child aborts with one line naming one of `calls` and, if want_ptr,
   the pointer. */
static void expect_abort(enum bad_kind kind, bool want_ptr, const char *const *calls)
{
    struct bad_case bc = {kind};
    struct gst_child c;
    void *bad;
    char why[4200];
    cr_assert(gst_run_child_ptr(bad_child, &bc, &c, &bad));
    cr_assert_not_null(bad, "the child did not report its pointer");
    cr_assert(gst_fatal_line_ok(&c, calls, want_ptr ? bad : NULL, why, sizeof why), "%s", why);
}

static const char *const cache_free_line[] = {"gs_cache_free", NULL};
static const char *const cache_free_rcu_line[] = {"gs_cache_free_rcu", "gs_free_rcu", NULL};
static const char *const destroy_line[] = {"gs_cache_destroy", NULL};

Test(bad_input, cache_free_with_the_wrong_cache) { expect_abort(WRONG_CACHE, true, cache_free_line); }
Test(bad_input, cache_free_of_a_malloc_pointer) { expect_abort(MALLOC_POINTER, true, cache_free_line); }
Test(bad_input, cache_free_rcu_twice) { expect_abort(FREE_RCU_TWICE, true, cache_free_rcu_line); }
Test(bad_input, cache_free_after_free_rcu) { expect_abort(FREE_AFTER_FREE_RCU, true, cache_free_line); }
Test(bad_input, destroy_with_live_objects) { expect_abort(DESTROY_LIVE, false, destroy_line); }
