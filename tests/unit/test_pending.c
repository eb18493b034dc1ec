/*
 * Deferred free (gs_free_rcu) and the reclaim of pending memory, through
 * the public API only:
 *   - gs_free_rcu makes no system call and allocates nothing (seccomp);
 *   - out of memory: allocation reclaims pending memory outside a read-side
 *     section; inside one, with everything pending, it fails with ENOMEM at
 *     once (no wait, no deadlock) and succeeds after the unlock;
 *   - every allocator call is safe inside a read-side section;
 *   - gs_reclaim() returns the exact bytes made reusable, per-class stats;
 *   - objects deferred by an exiting thread are reclaimed, never leaked;
 *   - lazy reclaim: with no further traffic, pending drains on its own;
 *   - bad input aborts with one line naming the call and the pointer.
 *
 * Tests that need allocator options (GRACESLAB_OS_FAIL_AFTER_MB,
 * GRACESLAB_RCU_LAZY_MS) re-execute this program with the option in its
 * environment: options are read once, at the first allocation, long before
 * a Criterion test starts. The re-executed program runs one scenario from a
 * constructor (child_mode below) and never reaches Criterion's main.
 */
#include "include/graceslab.h"
#include "tests/common.h"

#include <criterion/criterion.h>

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

/* ------------------------------------------------------------- helpers */

static size_t pending_bytes(void)
{
    struct gs_stats st;
    gs_stats_get(&st);
    return st.pending_bytes;
}

/* Drains everything pending so that a test starts from zero. */
static void drain_pending(void)
{
    for (int i = 0; i < 100 && pending_bytes(); i++)
        gs_reclaim(SIZE_MAX);
    cr_assert_eq(pending_bytes(), 0, "pending memory left after gs_reclaim");
}

static int class_index(const struct gs_stats *st, size_t usable)
{
    for (unsigned c = 0; c < st->nclasses; c++)
        if (st->class_size[c] == usable)
            return (int)c;
    return -1;
}

/* ------------------------------------------------- re-executed scenarios */

/* Fills memory with blocks of `size` until gs_malloc fails; returns count. */
static size_t fill(void **ptrs, size_t max, size_t size)
{
    size_t n = 0;
    for (; n < max; n++) {
        errno = 0;
        ptrs[n] = gs_malloc(size);
        if (!ptrs[n]) {
            GST_CHILD_CHECK(errno == ENOMEM, "errno %d after a failed gs_malloc(%zu)", errno, size);
            return n;
        }
        memset(ptrs[n], 0x5a, size < 256 ? size : 256);
    }
    gst_child_fail("gs_malloc(%zu) never failed: is GRACESLAB_OS_FAIL_AFTER_MB set?", size);
}

#define OOM_LIMIT_MB "48"
#define OOM_MAX_PTRS ((size_t)1 << 20)

/* Fill with `fill_size` blocks, defer them all, then allocate `again_size`
   outside (reader = false) or inside a read-side section. */
static void oom_scenario(size_t fill_size, size_t again_size, bool reader, bool warm)
{
    void **ptrs = gst_raw_array(OOM_MAX_PTRS);
    GST_CHILD_CHECK(ptrs != NULL, "mmap");
    if (warm) {
        /* A deferral and an allocation slow path while memory is plentiful:
           the engine's lazy thread exists before memory runs out. */
        gs_free_rcu(gs_malloc(64));
        gs_free(gs_malloc(20000));
        gs_reclaim(SIZE_MAX);
    }
    size_t n = fill(ptrs, OOM_MAX_PTRS, fill_size);
    GST_CHILD_CHECK(n * fill_size >= ((size_t)16 << 20), "only %zu blocks of %zu B fit", n, fill_size);
    /* Still out of memory for this size. */
    errno = 0;
    GST_CHILD_CHECK(gs_malloc(fill_size) == NULL && errno == ENOMEM, "memory appeared from nowhere");

    if (reader) {
        /* The deferrals happen inside the section: no grace period that
           covers them can end before the unlock. */
        gs_rcu_read_lock();
        for (size_t i = 0; i < n; i++)
            gs_free_rcu(ptrs[i]);
        double t0 = gst_now_s();
        errno = 0;
        void *p = gs_malloc(again_size);
        double dt = gst_now_s() - t0;
        GST_CHILD_CHECK(p == NULL, "gs_malloc(%zu) inside a read-side section returned %p "
                               "although all memory is pending on this reader", again_size, p);
        GST_CHILD_CHECK(errno == ENOMEM, "errno %d, expected ENOMEM", errno);
        GST_CHILD_CHECK(dt < 2.0, "the failing allocation took %.3f s (it must not wait)", dt);
        /* Polling reclaim inside the section cannot free what the section
           protects. */
        size_t r = gs_reclaim(SIZE_MAX);
        GST_CHILD_CHECK(r == 0, "gs_reclaim inside the reader reclaimed %zu bytes "
                            "deferred inside that same reader", r);
        gs_rcu_read_unlock();
    } else {
        for (size_t i = 0; i < n; i++)
            gs_free_rcu(ptrs[i]);
    }
    errno = 0;
    void *p = gs_malloc(again_size);
    GST_CHILD_CHECK(p != NULL, "gs_malloc(%zu) failed (errno %d) with %zu bytes pending: "
                           "pending memory was not reclaimed", again_size, errno, n * fill_size);
    memset(p, 1, again_size);
    /* Most of what was deferred is usable again. */
    gs_free(p);
    size_t m = 0;
    while (m < OOM_MAX_PTRS && m * again_size < n * fill_size / 2 &&
           (ptrs[m] = gs_malloc(again_size)) != NULL)
        m++;
    GST_CHILD_CHECK(m * again_size >= n * fill_size / 2,
                "after reclaim only %zu x %zu B fit again (had %zu x %zu B)", m, again_size, n,
                fill_size);
}

/* Lazy reclaim: a burst of deferrals, one allocation slow path, then no
   allocator traffic at all: pending must drain on its own. */
static size_t burst_pending; /* right after the deferrals */

static void *lazy_burst(void *arg)
{
    size_t n = (size_t)(uintptr_t)arg;
    void **ptrs = gst_raw_array(n);
    GST_CHILD_CHECK(ptrs != NULL, "mmap");
    for (size_t i = 0; i < n; i++) {
        ptrs[i] = gs_malloc(64);
        GST_CHILD_CHECK(ptrs[i] != NULL, "gs_malloc");
    }
    for (size_t i = 0; i < n; i++)
        gs_free_rcu(ptrs[i]);
    /* Counted before the slow path below kicks the background thread:
       from then on it may drain them at any moment. */
    struct gs_stats st;
    gs_stats_get(&st);
    burst_pending = st.pending_objects;
    /* One slow path: the first block of a class this thread never used. */
    void *p = gs_malloc(12000);
    GST_CHILD_CHECK(p != NULL, "gs_malloc");
    gs_free(p);
    return NULL;
}

static void lazy_scenario(bool in_thread)
{
    const size_t n = 20000;
    struct gs_stats st0, st;
    gs_stats_get(&st0);
    if (in_thread) {
        pthread_t t;
        GST_CHILD_CHECK(pthread_create(&t, NULL, lazy_burst, (void *)(uintptr_t)n) == 0, "");
        pthread_join(t, NULL);
    } else {
        lazy_burst((void *)(uintptr_t)n);
    }
    GST_CHILD_CHECK(burst_pending >= n / 2, "only %zu pending right after the burst",
                    burst_pending);
    double t0 = gst_now_s();
    do {
        gst_sleep_ms(20);
        gs_stats_get(&st);
    } while (st.pending_objects && gst_now_s() - t0 < 5.0);
    GST_CHILD_CHECK(st.pending_objects == 0, "%zu objects (%zu B) still pending %.1f s after the "
                                         "burst with GRACESLAB_RCU_LAZY_MS=100",
                st.pending_objects, st.pending_bytes, gst_now_s() - t0);
    GST_CHILD_CHECK(st.reclaimed_objects - st0.reclaimed_objects >= n, "reclaimed %zu < %zu",
                st.reclaimed_objects - st0.reclaimed_objects, n);
}

/* gs_reclaim against the engine's background thread, which sweeps on its
   own once a refill kicked it: whatever either took, once gs_reclaim
   returns nothing is pending (the statistics are exact for every sweep).
   The background thread's sweep frees the large blocks it took after its
   slab walk, and gs_reclaim once returned while that was still going on.
   Run with GRACESLAB_RCU_LAZY_MS=1, so that the two race every round; a
   random pause of up to 2 ms moves the window. */
static void background_sweep_scenario(void)
{
    enum { ROUNDS = 1000, LARGE = 64, KICKS = 64 };
    void *big[LARGE], *kick[KICKS];
    unsigned r = 12345;
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < LARGE; i++)
            GST_CHILD_CHECK((big[i] = gs_malloc(300000)) != NULL, "gs_malloc");
        for (int i = 0; i < LARGE; i++)
            gs_free_rcu(big[i]);
        /* Enough 12000-byte blocks for several slabs: refills, which kick
           the background thread (something is pending). */
        for (int i = 0; i < KICKS; i++)
            GST_CHILD_CHECK((kick[i] = gs_malloc(12000)) != NULL, "gs_malloc");
        for (int i = 0; i < KICKS; i++)
            gs_free(kick[i]);
        r = r * 1103515245u + 12345u;
        struct timespec t = {0, (long)((r >> 8) % 2000000)};
        nanosleep(&t, NULL);
        gs_reclaim(SIZE_MAX);
        struct gs_stats st;
        gs_stats_get(&st);
        GST_CHILD_CHECK(st.pending_objects == 0,
                        "round %d: %zu objects (%zu B) pending after gs_reclaim returned", round,
                        st.pending_objects, st.pending_bytes);
    }
}

static void thread_exit_scenario(void); /* below, with its test */

__attribute__((constructor)) static void child_mode(void)
{
    const char *m = getenv("GS_PENDING_CHILD");
    if (!m)
        return;
    static const struct {
        const char *name;
        size_t fill, again;
        bool reader;
    } oom[] = {
        {"oom_small", 64, 64, false},
        {"oom_small_reader", 64, 64, true},
        {"oom_large", 256 << 10, 256 << 10, false},
        {"oom_large_reader", 256 << 10, 256 << 10, true},
        {"oom_small_to_other_class", 64, 4096, false},
        {"oom_large_to_small", 256 << 10, 64, false},
    };
    for (size_t i = 0; i < sizeof oom / sizeof oom[0]; i++) {
        size_t len = strlen(oom[i].name);
        if (!strncmp(m, oom[i].name, len) && (!m[len] || !strcmp(m + len, "_warm"))) {
            oom_scenario(oom[i].fill, oom[i].again, oom[i].reader, m[len] != 0);
            _exit(0);
        }
    }
    if (0)
        ;
    else if (!strcmp(m, "lazy"))
        lazy_scenario(false);
    else if (!strcmp(m, "lazy_thread"))
        lazy_scenario(true);
    else if (!strcmp(m, "background_sweep"))
        background_sweep_scenario();
    else if (!strcmp(m, "thread_exit"))
        thread_exit_scenario();
    else
        gst_child_fail("unknown GS_PENDING_CHILD=%s", m);
    _exit(0);
}

static void run_mode(const char *mode, const char *env1)
{
    struct gst_exec_args a = {"GS_PENDING_CHILD", mode, {env1, NULL}};
    struct gst_child c;
    cr_assert(gst_run_child(gst_exec_self, &a, &c));
    GST_ASSERT_CHILD_OK(&c, mode);
}

/* ---------------------------------------------------- out of memory */

/* Two variants of each: "cold" defers for the first time once memory is
   already exhausted (the engine must still get its grace period without
   aborting), "warm" has the engine's lazy thread started beforehand. */
#define OOM_TEST(name, mode, what)                                             \
    Test(oom, name, .description = what, .timeout = 60)                       \
    {                                                                          \
        run_mode(mode, "GRACESLAB_OS_FAIL_AFTER_MB=" OOM_LIMIT_MB);           \
    }                                                                          \
    Test(oom, name##_warm, .description = what, .timeout = 60)                \
    {                                                                          \
        run_mode(mode "_warm", "GRACESLAB_OS_FAIL_AFTER_MB=" OOM_LIMIT_MB);   \
    }

OOM_TEST(small_reclaims_pending_outside_reader, "oom_small",
         "64 B blocks: allocation reclaims pending memory")
OOM_TEST(small_enomem_inside_reader_then_ok, "oom_small_reader",
         "inside a reader with all memory pending: ENOMEM at once; after unlock: success")
OOM_TEST(large_reclaims_pending_outside_reader, "oom_large",
         "large blocks: allocation reclaims pending memory")
OOM_TEST(large_enomem_inside_reader_then_ok, "oom_large_reader",
         "large blocks inside a reader: ENOMEM at once; after unlock: success")
OOM_TEST(pending_small_serves_other_class, "oom_small_to_other_class",
         "memory deferred in one size class serves another once reclaimed")
OOM_TEST(pending_large_serves_small, "oom_large_to_small",
         "memory deferred as large blocks serves small ones once reclaimed")

/* ---------------------------------------------------- lazy reclaim */

Test(lazy, pending_drains_without_traffic, .timeout = 60)
{
    run_mode("lazy", "GRACESLAB_RCU_LAZY_MS=100");
}

Test(lazy, pending_of_exited_thread_drains_without_traffic, .timeout = 60)
{
    run_mode("lazy_thread", "GRACESLAB_RCU_LAZY_MS=100");
}

/* ------------------------------------- no system call, no allocation */

static volatile sig_atomic_t sc_phase;

static void on_sigsys(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    char buf[160];
    int n = snprintf(buf, sizeof buf, "system call %d made %s\n", si->si_syscall,
                     sc_phase == 1 ? "by gs_free_rcu / gs_rcu_read_lock / gs_rcu_read_unlock"
                                   : "by gs_stats_get (after the checked calls)");
    ssize_t ignored = write(STDERR_FILENO, buf, (size_t)n);
    (void)ignored;
    _exit(sc_phase == 1 ? 3 : 4);
}

/* Only write and the exit calls are allowed; anything else traps. */
static bool install_seccomp(void)
{
    struct sock_filter f[] = {
        GST_SECCOMP_PROLOGUE,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_write, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_exit_group, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_sigreturn, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    return gst_seccomp_install(f, sizeof f / sizeof f[0]);
}

static void *alloc_in_thread(void *arg)
{
    void **ptrs = arg;
    for (int i = 0; i < 512; i++)
        ptrs[i] = gs_malloc(48);
    return NULL;
}

#define SC_N 4096

static void no_syscall_child(void *arg)
{
    (void)arg;
    static void *own[SC_N], *other[512], *large[8];
    size_t bytes = 0;
    for (int i = 0; i < SC_N; i++) {
        own[i] = gs_malloc(16 + (size_t)(i % 64) * 16); /* many classes */
        GST_CHILD_CHECK(own[i] != NULL, "");
        bytes += gs_usable_size(own[i]);
    }
    for (int i = 0; i < 8; i++) {
        large[i] = gs_malloc((size_t)(40 + i) << 10);
        GST_CHILD_CHECK(large[i] != NULL, "");
        bytes += gs_usable_size(large[i]);
    }
    /* Blocks of a thread that has exited: their slabs are ownerless or
       orphaned, so gs_free_rcu takes its adoption path. */
    pthread_t t;
    GST_CHILD_CHECK(pthread_create(&t, NULL, alloc_in_thread, other) == 0, "");
    pthread_join(t, NULL);
    for (int i = 0; i < 512; i++) {
        GST_CHILD_CHECK(other[i] != NULL, "");
        bytes += gs_usable_size(other[i]);
    }
    /* Registration of this thread as a reader may make system calls. */
    gs_rcu_read_lock();
    gs_rcu_read_unlock();
    struct gs_stats before, after;
    gs_stats_get(&before);

    struct sigaction sa = {.sa_sigaction = on_sigsys, .sa_flags = SA_SIGINFO};
    sigaction(SIGSYS, &sa, NULL);
    GST_CHILD_CHECK(install_seccomp(), "seccomp: %s", strerror(errno));
    sc_phase = 1;
    gs_rcu_read_lock();
    for (int i = 0; i < SC_N; i += 2)
        gs_free_rcu(own[i]);
    for (int i = 0; i < 4; i++)
        gs_free_rcu(large[i]);
    for (int i = 0; i < 256; i++)
        gs_free_rcu(other[i]);
    gs_rcu_read_unlock();
    for (int i = 1; i < SC_N; i += 2)
        gs_free_rcu(own[i]);
    for (int i = 4; i < 8; i++)
        gs_free_rcu(large[i]);
    for (int i = 256; i < 512; i++)
        gs_free_rcu(other[i]);
    sc_phase = 2;
    gs_stats_get(&after);

    size_t n = SC_N + 8 + 512;
    GST_CHILD_CHECK(after.mapped_bytes == before.mapped_bytes, "mapped %zu -> %zu",
                before.mapped_bytes, after.mapped_bytes);
    GST_CHILD_CHECK(after.pending_objects == before.pending_objects + n,
                "pending objects %zu -> %zu, expected +%zu", before.pending_objects,
                after.pending_objects, n);
    GST_CHILD_CHECK(after.pending_bytes == before.pending_bytes + bytes,
                "pending bytes %zu -> %zu, expected +%zu", before.pending_bytes,
                after.pending_bytes, bytes);
    GST_CHILD_CHECK(after.allocated_bytes <= before.allocated_bytes, "allocated %zu -> %zu",
                before.allocated_bytes, after.allocated_bytes);
}

Test(free_rcu, makes_no_system_call_and_allocates_nothing, .timeout = 60)
{
    struct gst_child c;
    cr_assert(gst_run_child(no_syscall_child, NULL, &c));
    GST_ASSERT_CHILD_OK(&c, "gs_free_rcu under seccomp");
}

/* --------------------------------------- calls inside a read-side section */

/* Enough pending memory in one class that an allocation outside a reader
   would wait for a grace period rather than map more. */
static void **defer_lots(size_t n, size_t size)
{
    void **p = gst_raw_array(n);
    GST_CHILD_CHECK(p != NULL, "");
    for (size_t i = 0; i < n; i++) {
        p[i] = gs_malloc(size);
        GST_CHILD_CHECK(p[i] != NULL, "");
    }
    for (size_t i = 0; i < n; i++)
        gs_free_rcu(p[i]);
    return p;
}

static void reader_malloc_free(void *arg)
{
    (void)arg;
    alarm(10);
    defer_lots(32768, 64); /* 2 MiB pending in class 64 */
    gs_rcu_read_lock();
    defer_lots(32768, 64); /* and 2 MiB this reader protects */
    void **p = gst_raw_array(100000);
    for (size_t i = 0; i < 100000; i++) {
        p[i] = gs_malloc(64);
        GST_CHILD_CHECK(p[i] != NULL, "gs_malloc(64) #%zu in a reader", i);
        memset(p[i], 7, 64);
    }
    for (size_t i = 0; i < 100000; i++)
        gs_free(p[i]);
    gs_rcu_read_unlock();
}

static void reader_calloc_realloc(void *arg)
{
    (void)arg;
    alarm(10);
    defer_lots(32768, 64);
    gs_rcu_read_lock();
    gs_rcu_read_lock(); /* nested */
    defer_lots(4096, 6400); /* another class pending in-section */
    for (int i = 0; i < 2000; i++) {
        unsigned char *c = gs_calloc(8, 8);
        GST_CHILD_CHECK(c != NULL, "");
        for (int k = 0; k < 64; k++)
            GST_CHILD_CHECK(c[k] == 0, "calloc not zeroed");
        c = gs_realloc(c, 200);         /* another class */
        GST_CHILD_CHECK(c != NULL, "");
        c = gs_realloc(c, 100 << 10);   /* small -> large */
        GST_CHILD_CHECK(c != NULL, "");
        c = gs_realloc(c, 300 << 10);   /* large grows */
        GST_CHILD_CHECK(c != NULL, "");
        c = gs_realloc(c, 24);          /* large -> small */
        GST_CHILD_CHECK(c != NULL, "");
        void *a = gs_aligned_alloc(4096, 100);
        GST_CHILD_CHECK(a != NULL && ((uintptr_t)a & 4095) == 0, "");
        gs_free(a);
        gs_free(c);
    }
    gs_rcu_read_unlock();
    gs_rcu_read_unlock();
}

static void *alloc_one_64(void *arg)
{
    *(void **)arg = gs_malloc(64);
    return NULL;
}

static void reader_free_rcu_and_reclaim(void *arg)
{
    (void)arg;
    alarm(10);
    /* Nothing pending, then defer inside the section: gs_reclaim there only
       polls and must not make any of it reusable. */
    while (gs_reclaim(SIZE_MAX))
        ;
    void *remote = NULL;
    pthread_t t;
    GST_CHILD_CHECK(pthread_create(&t, NULL, alloc_one_64, &remote) == 0, "");
    pthread_join(t, NULL);
    GST_CHILD_CHECK(remote != NULL, "");
    void *small = gs_malloc(64), *large = gs_malloc(1 << 20);
    GST_CHILD_CHECK(small && large, "");
    size_t want = gs_usable_size(small) + gs_usable_size(large) + gs_usable_size(remote);
    gs_rcu_read_lock();
    gs_free_rcu(small);
    gs_free_rcu(large);
    gs_free_rcu(remote);
    gs_free_rcu(NULL);
    for (int i = 0; i < 3; i++) {
        size_t r = gs_reclaim(SIZE_MAX);
        GST_CHILD_CHECK(r == 0, "gs_reclaim in the reader made %zu bytes reusable that the "
                            "reader still protects", r);
    }
    struct gs_stats st;
    gs_stats_get(&st);
    GST_CHILD_CHECK(st.pending_objects == 3, "pending %zu, expected 3", st.pending_objects);
    /* Allocation in the section with pending memory around must not hand
       out a protected object. */
    for (int i = 0; i < 1000; i++) {
        void *p = gs_malloc(64);
        GST_CHILD_CHECK(p != small && p != remote, "a pending object was handed out in its reader");
    }
    gs_rcu_read_unlock();
    size_t r = gs_reclaim(SIZE_MAX);
    GST_CHILD_CHECK(r == want, "gs_reclaim after the section returned %zu, expected %zu", r, want);
}

Test(in_reader, malloc_free_never_wait, .timeout = 60)
{
    struct gst_child c;
    cr_assert(gst_run_child(reader_malloc_free, NULL, &c));
    GST_ASSERT_CHILD_OK(&c, "malloc/free in a reader");
}

Test(in_reader, calloc_realloc_aligned_never_wait, .timeout = 60)
{
    struct gst_child c;
    cr_assert(gst_run_child(reader_calloc_realloc, NULL, &c));
    GST_ASSERT_CHILD_OK(&c, "calloc/realloc in a reader");
}

Test(in_reader, free_rcu_and_reclaim_only_poll, .timeout = 60)
{
    struct gst_child c;
    cr_assert(gst_run_child(reader_free_rcu_and_reclaim, NULL, &c));
    GST_ASSERT_CHILD_OK(&c, "gs_free_rcu/gs_reclaim in a reader");
}

/* ---------------------------------------------------- gs_reclaim exact */

/* Large blocks deferred past GRACESLAB_PENDING_EXPEDITE_KB (256 KiB by
   default) make the next large allocation wait for their grace period and
   free them (the bound was once four times the option). */
Test(reclaim, large_pending_bounded_by_the_expedite_option, .timeout = 60)
{
    gs_reclaim(SIZE_MAX);
    void *b[2];
    for (int i = 0; i < 2; i++)
        b[i] = gs_malloc(400 << 10);
    for (int i = 0; i < 2; i++)
        gs_free_rcu(b[i]);
    struct gs_stats st;
    gs_stats_get(&st);
    cr_assert_geq(st.pending_bytes, (size_t)800 << 10);
    void *x = gs_malloc(300 << 10); /* the large path: their refill */
    gs_stats_get(&st);
    cr_assert_leq(st.pending_bytes, (size_t)256 << 10, "%zu KiB pending", st.pending_bytes >> 10);
    gs_free(x);
}

/* Large blocks past that bound, allocated inside a reader whose section
   began after a grace period started (which therefore does not wait for
   it): the allocation waits for that grace period's end, at most
   GS_READER_WAIT_NS (20 ms), before mapping. It used to only expedite,
   and 4 writers of 320 KiB blocks inside sections peaked at 1.6 GiB
   pending (pending_membound). */
static struct gst_held_reader large_old;

static void *release_large_old(void *arg)
{
    (void)arg;
    gst_sleep_ms(5);
    atomic_store(&large_old.release, 1);
    return NULL;
}

/* A registered thread with nothing pending, and two large blocks to defer
   (800 KiB: past the expedite bound). */
static void two_large_blocks(void *b[2])
{
    gs_rcu_register_thread();
    gs_reclaim(SIZE_MAX);
    for (int i = 0; i < 2; i++)
        cr_assert_not_null(b[i] = gs_malloc(400 << 10));
}

Test(in_reader, large_allocation_waits_out_the_grace_period_in_progress, .timeout = 60)
{
    void *b[2];
    two_large_blocks(b);
    cr_assert(gst_reader_hold(&large_old));
    for (int i = 0; i < 2; i++)
        gs_free_rcu(b[i]);
    struct gs_stats st;
    gs_stats_get(&st);
    unsigned long started = st.gp_started;
    struct gst_syncer s;
    cr_assert(gst_syncer_start(&s));
    do {
        gst_sleep_ms(1);
        gs_stats_get(&st);
    } while (st.gp_started == started);
    cr_assert_eq(st.gp_completed, started, "a grace period ended with `old` inside");
    gs_rcu_read_lock(); /* after the start: that grace period does not wait for us */
    pthread_t rel;
    cr_assert_eq(pthread_create(&rel, NULL, release_large_old, NULL), 0);
    double t0 = gst_now_s();
    void *x = gs_malloc(300 << 10);
    double waited = gst_now_s() - t0;
    bool released = atomic_load(&large_old.release);
    cr_assert_not_null(x);
    /* Either the grace period ended (`old` had to leave first) or the
       wait ran out its bound; returning at once is what it used to do. */
    cr_assert(released || waited >= 0.020,
              "returned after %.2f ms with the grace period in progress still open",
              waited * 1e3);
    gs_rcu_read_unlock();
    pthread_join(rel, NULL);
    gst_reader_release(&large_old);
    pthread_join(s.t, NULL);
    gs_free(x);
    gs_rcu_unregister_thread();
}

/* With no grace period open when the section began, every later one waits
   for the section: the large allocation past the bound cannot wait inside
   it and leaves the wait to the unlock (docs/rcu.md, "Waits owed to the
   unlock"), which returns once a grace period has ended. It used to return
   at once, and the writers of 320 KiB blocks inside sections peaked at 100
   to 210 MiB pending (3 MiB since). */
Test(in_reader, large_allocation_with_no_grace_period_open_waits_at_the_unlock, .timeout = 60)
{
    void *b[2];
    two_large_blocks(b);
    struct gs_stats st;
    gs_stats_get(&st);
    cr_assert_eq(st.gp_started, st.gp_completed, "a grace period is open");
    gs_rcu_read_lock();
    for (int i = 0; i < 2; i++)
        gs_free_rcu(b[i]);
    void *x = gs_malloc(300 << 10);
    cr_assert_not_null(x);
    /* No grace period can end while this section is open: every one that
       could has to wait for it. */
    gs_stats_get(&st);
    unsigned long completed = st.gp_completed;
    gs_rcu_read_unlock();
    gs_stats_get(&st);
    cr_assert_gt(st.gp_completed, completed,
                 "the unlock returned before the grace period the allocation needed");
    gs_free(x);
    gs_rcu_unregister_thread();
}

/* More slabs with objects pending under this reader than one sweep batch
   (1024) settles: gs_reclaim inside the section returns (it used to start
   its walk over forever), and after the section reclaims all of them. */
Test(in_reader, reclaim_over_many_waiting_slabs_returns, .timeout = 60)
{
    enum { SLABS = 1400, PER = 16, SIZE = 4096 }; /* at most 16 per slab (64 KiB) */
    void **p = gst_raw_array(SLABS * PER);
    for (size_t i = 0; i < SLABS * PER; i++)
        cr_assert_not_null(p[i] = gs_malloc(SIZE));
    gs_reclaim(SIZE_MAX);
    gs_rcu_read_lock();
    size_t n = 0;
    for (size_t i = 0; i < SLABS * PER; i += PER / 2, n++)
        gs_free_rcu(p[i]); /* two in every slab */
    size_t inside = gs_reclaim(SIZE_MAX);
    gs_rcu_read_unlock();
    cr_assert_eq(inside, 0, "reclaimed under the reader that protects them");
    cr_assert_eq(gs_reclaim(SIZE_MAX), n * SIZE);
    for (size_t i = 0; i < SLABS * PER; i++)
        if (i % (PER / 2))
            gs_free(p[i]);
}

/* One thread allocates, another defers the frees (a writer handing old
   versions to a reclaimer thread): memory stays bounded by the live set,
   not by everything ever allocated. The deferring thread used to adopt the
   full slabs and keep the reclaimed objects on their remote chains for
   allocations it never made (258 MiB mapped for 1 M objects of 256 B). */
enum { HAND_RING = 16384, HAND_SIZE = 256 };
static void *hand_ring[HAND_RING];
static _Atomic unsigned long hand_head, hand_tail;
static const unsigned long hand_total = 1000000;

static void *hand_producer(void *arg)
{
    (void)arg;
    for (unsigned long i = 0; i < hand_total; i++) {
        while (atomic_load(&hand_head) - atomic_load(&hand_tail) >= HAND_RING)
            sched_yield();
        void *p = gs_malloc(HAND_SIZE);
        if (!p)
            return (void *)1;
        memset(p, 1, HAND_SIZE);
        hand_ring[i % HAND_RING] = p;
        atomic_store(&hand_head, i + 1);
    }
    return NULL;
}

static void *hand_deferrer(void *arg)
{
    (void)arg;
    gs_free(gs_malloc(24)); /* a heap, of another class */
    for (unsigned long i = 0; i < hand_total; i++) {
        while (atomic_load(&hand_head) <= i)
            sched_yield();
        void *p = hand_ring[i % HAND_RING];
        atomic_store(&hand_tail, i + 1);
        gs_free_rcu(p);
    }
    return NULL;
}

Test(reclaim, another_threads_deferrals_stay_bounded, .timeout = 120)
{
    pthread_t p, d;
    void *pr, *dr;
    cr_assert_eq(pthread_create(&d, NULL, hand_deferrer, NULL), 0);
    cr_assert_eq(pthread_create(&p, NULL, hand_producer, NULL), 0);
    pthread_join(p, &pr);
    pthread_join(d, &dr);
    cr_assert_null(pr, "allocation failed");
    struct gs_stats st;
    gs_stats_get(&st);
    /* Live at most 4 MiB; pending bounded by the expedite option per class
       plus what one grace period lets through. */
    cr_assert_leq(st.mapped_bytes, (size_t)48 << 20, "%zu MiB mapped for %lu objects of %d B",
                  st.mapped_bytes >> 20, hand_total, HAND_SIZE);
}

Test(reclaim, nothing_pending_after_return_while_background_thread_sweeps, .timeout = 120)
{
    run_mode("background_sweep", "GRACESLAB_RCU_LAZY_MS=1");
}

Test(reclaim, returns_exact_usable_bytes, .timeout = 60)
{
    static const size_t sizes[] = {1, 16, 17, 48, 100, 1000, 1024, 5000, 32768, 40000, 300000};
    enum { PER = 50, NS = sizeof sizes / sizeof sizes[0] };
    void *p[NS][PER];
    size_t want = 0;
    size_t want_class[GS_STATS_CLASSES] = {0};
    struct gs_stats st0, st1, st2;
    gs_stats_get(&st0);
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < PER; i++) {
            p[s][i] = gs_malloc(sizes[s]);
            cr_assert_not_null(p[s][i]);
        }
    drain_pending();
    gs_stats_get(&st0);
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < PER; i++) {
            size_t u = gs_usable_size(p[s][i]);
            cr_assert_geq(u, sizes[s]);
            want += u;
            int c = class_index(&st0, u);
            if (sizes[s] <= 256 << 10) { /* a slab class (GS_SMALL_MAX) */
                cr_assert_geq(c, 0, "no class of size %zu in gs_stats", u);
                want_class[c]++;
            }
            gs_free_rcu(p[s][i]);
        }
    gs_stats_get(&st1);
    cr_assert_eq(st1.pending_objects, st0.pending_objects + NS * PER);
    cr_assert_eq(st1.pending_bytes, st0.pending_bytes + want, "pending bytes %zu, expected %zu",
                 st1.pending_bytes - st0.pending_bytes, want);
    for (unsigned c = 0; c < st1.nclasses; c++) {
        cr_assert_eq(st1.class_pending_objects[c], st0.class_pending_objects[c] + want_class[c],
                     "class %zu B: %zu pending, expected %zu", st1.class_size[c],
                     st1.class_pending_objects[c], want_class[c]);
        cr_assert_eq(st1.class_pending_bytes[c], st1.class_pending_objects[c] * st1.class_size[c]);
    }

    size_t got = gs_reclaim(SIZE_MAX);
    cr_assert_eq(got, want, "gs_reclaim returned %zu, the deferred blocks' usable sizes sum "
                            "to %zu", got, want);
    gs_stats_get(&st2);
    cr_assert_eq(st2.pending_objects, 0);
    cr_assert_eq(st2.pending_bytes, 0);
    for (unsigned c = 0; c < st2.nclasses; c++)
        cr_assert_eq(st2.class_pending_objects[c], 0);
    cr_assert_eq(st2.reclaimed_objects, st1.reclaimed_objects + NS * PER);
    cr_assert_gt(st2.gp_completed, st1.gp_completed);
    cr_assert_geq(st2.gp_started, st2.gp_completed);
    /* Nothing left: a second call reclaims nothing. */
    cr_assert_eq(gs_reclaim(SIZE_MAX), 0);
}

/* ---------------------------------------------------------- thread exit */

struct exit_args {
    void **own;     /* allocated and deferred by the thread */
    void **foreign; /* allocated by the main thread, deferred by the thread */
    size_t n;
    size_t want;    /* usable bytes of both, read before the deferral */
};

static void *defer_and_exit(void *arg)
{
    struct exit_args *a = arg;
    a->want = 0;
    for (size_t i = 0; i < a->n; i++) {
        a->own[i] = gs_malloc(32 + i % 200);
        memset(a->own[i], 3, 32);
        a->want += gs_usable_size(a->own[i]) + gs_usable_size(a->foreign[i]);
    }
    for (size_t i = 0; i < a->n; i++) {
        gs_free_rcu(a->own[i]);
        gs_free_rcu(a->foreign[i]);
    }
    return NULL;
}

/* Twice: a thread defers its own objects and the main thread's, and
   exits; one gs_reclaim returns exactly their bytes. Run with
   GRACESLAB_RCU_LAZY_MS=600000: the second round's refills kick the
   engine's background thread, whose own sweep (one lazy timeout later)
   would otherwise take a share that gs_reclaim does not count. */
static void thread_exit_scenario(void)
{
    enum { N = 5000 };
    static void *own[N], *foreign[N];
    for (size_t i = 0; i < N; i++)
        GST_CHILD_CHECK((foreign[i] = gs_malloc(i % 3 ? 80 : 50000)) != NULL, "gs_malloc");
    struct gs_stats st1, st2;
    struct exit_args a = {own, foreign, N, 0};
    for (int round = 0; round < 2; round++) {
        pthread_t t;
        GST_CHILD_CHECK(pthread_create(&t, NULL, defer_and_exit, &a) == 0, "pthread_create");
        pthread_join(t, NULL);
        gs_stats_get(&st1);
        GST_CHILD_CHECK(st1.pending_objects == 2 * N, "round %d: pending %zu after the thread "
                        "exited", round, st1.pending_objects);
        GST_CHILD_CHECK(st1.pending_bytes == a.want, "round %d: %zu bytes pending, %zu deferred",
                        round, st1.pending_bytes, a.want);
        size_t got = gs_reclaim(SIZE_MAX);
        GST_CHILD_CHECK(got == a.want, "round %d: reclaimed %zu of %zu bytes deferred by an "
                        "exited thread", round, got, a.want);
        gs_stats_get(&st2);
        GST_CHILD_CHECK(st2.pending_objects == 0, "round %d: %zu still pending", round,
                        st2.pending_objects);
        GST_CHILD_CHECK(st2.reclaimed_objects == st1.reclaimed_objects + 2 * N,
                        "round %d: %zu reclaimed, %d deferred", round,
                        st2.reclaimed_objects - st1.reclaimed_objects, 2 * N);
        for (size_t i = 0; i < N; i++)
            GST_CHILD_CHECK((foreign[i] = gs_malloc(i % 3 ? 80 : 50000)) != NULL, "gs_malloc");
    }
}

Test(thread_exit, deferred_objects_are_reclaimed, .timeout = 60)
{
    run_mode("thread_exit", "GRACESLAB_RCU_LAZY_MS=600000");
}

/* ------------------------------------------------------------ bad input */

enum bad_kind {
    FREE_RCU_TWICE_SMALL,
    FREE_RCU_TWICE_LARGE,
    FREE_RCU_TWICE_OTHER_THREAD,
    FREE_AFTER_FREE_RCU_SMALL,
    FREE_AFTER_FREE_RCU_LARGE,
    FREE_RCU_AFTER_FREE,
    FREE_RCU_STACK,
    FREE_RCU_STATIC,
    FREE_RCU_MMAP,
    FREE_RCU_INTERIOR,
    REALLOC_AFTER_FREE_RCU,
    REALLOC_AFTER_FREE_RCU_LARGE,
};

struct bad_case {
    enum bad_kind kind;
};

static char static_object[256] __attribute__((aligned(64)));

static void *free_rcu_thread(void *p)
{
    gs_free_rcu(p);
    return NULL;
}

static void bad_child(void *arg)
{
    struct bad_case *bc = arg;
    char stack_object[64];
    void *keep = gs_malloc(64); /* keeps the small slab alive */
    void *p = NULL;
    switch (bc->kind) {
    case FREE_RCU_TWICE_SMALL:
    case FREE_AFTER_FREE_RCU_SMALL:
    case FREE_RCU_AFTER_FREE:
    case FREE_RCU_INTERIOR:
    case REALLOC_AFTER_FREE_RCU:
    case FREE_RCU_TWICE_OTHER_THREAD:
        p = gs_malloc(64);
        break;
    case FREE_RCU_TWICE_LARGE:
    case FREE_AFTER_FREE_RCU_LARGE:
    case REALLOC_AFTER_FREE_RCU_LARGE:
        p = gs_malloc(100 << 10);
        break;
    case FREE_RCU_STACK:
        p = stack_object;
        break;
    case FREE_RCU_STATIC:
        p = static_object;
        break;
    case FREE_RCU_MMAP:
        p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        break;
    }
    void *bad = bc->kind == FREE_RCU_INTERIOR ? (char *)p + 16 : p;
    gst_child_report_ptr(bad);
    switch (bc->kind) {
    case FREE_RCU_TWICE_SMALL:
    case FREE_RCU_TWICE_LARGE:
        gs_free_rcu(p);
        gs_free_rcu(p);
        break;
    case FREE_RCU_TWICE_OTHER_THREAD: {
        gs_free_rcu(p);
        pthread_t t;
        pthread_create(&t, NULL, free_rcu_thread, p);
        pthread_join(t, NULL);
        break;
    }
    case FREE_AFTER_FREE_RCU_SMALL:
    case FREE_AFTER_FREE_RCU_LARGE:
        gs_free_rcu(p);
        gs_free(p);
        break;
    case REALLOC_AFTER_FREE_RCU:
        gs_free_rcu(p);
        p = gs_realloc(p, 20000);
        break;
    case REALLOC_AFTER_FREE_RCU_LARGE:
        gs_free_rcu(p);
        p = gs_realloc(p, 100 << 10); /* the size it has: the in-place path */
        break;
    case FREE_RCU_AFTER_FREE:
        gs_free(p);
        gs_free_rcu(p);
        break;
    default:
        gs_free_rcu(bad);
        break;
    }
    (void)keep;
    /* Reaching this point is the failure: the parent expects SIGABRT. */
}

static void expect_abort(enum bad_kind kind, const char *call)
{
    struct bad_case bc = {kind};
    struct gst_child c;
    void *bad;
    char why[4200];
    cr_assert(gst_run_child_ptr(bad_child, &bc, &c, &bad));
    cr_assert_not_null(bad, "the child did not report its pointer");
    cr_assert(gst_fatal_line_ok(&c, (const char *const[]){call, NULL}, bad, why, sizeof why),
              "%s", why);
}

Test(bad_input, free_rcu_twice_small) { expect_abort(FREE_RCU_TWICE_SMALL, "gs_free_rcu"); }
Test(bad_input, free_rcu_twice_large) { expect_abort(FREE_RCU_TWICE_LARGE, "gs_free_rcu"); }
Test(bad_input, free_rcu_twice_from_another_thread)
{
    expect_abort(FREE_RCU_TWICE_OTHER_THREAD, "gs_free_rcu");
}
Test(bad_input, free_after_free_rcu_small) { expect_abort(FREE_AFTER_FREE_RCU_SMALL, "free"); }
Test(bad_input, free_after_free_rcu_large) { expect_abort(FREE_AFTER_FREE_RCU_LARGE, "free"); }
Test(bad_input, realloc_after_free_rcu) { expect_abort(REALLOC_AFTER_FREE_RCU, "realloc"); }
Test(bad_input, realloc_after_free_rcu_large)
{
    expect_abort(REALLOC_AFTER_FREE_RCU_LARGE, "realloc");
}
Test(bad_input, free_rcu_after_free) { expect_abort(FREE_RCU_AFTER_FREE, "gs_free_rcu"); }
Test(bad_input, free_rcu_stack_pointer) { expect_abort(FREE_RCU_STACK, "gs_free_rcu"); }
Test(bad_input, free_rcu_static_pointer) { expect_abort(FREE_RCU_STATIC, "gs_free_rcu"); }
Test(bad_input, free_rcu_mmap_pointer) { expect_abort(FREE_RCU_MMAP, "gs_free_rcu"); }
Test(bad_input, free_rcu_interior_pointer) { expect_abort(FREE_RCU_INTERIOR, "gs_free_rcu"); }
