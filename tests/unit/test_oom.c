/*
 * Out of memory from every allocation entry point, with fault injection
 * (GRACESLAB_OS_FAIL_AFTER_MB: the OS layer refuses memory beyond the limit):
 * malloc, calloc, realloc (grow), reallocarray (grow), aligned_alloc,
 * posix_memalign, memalign, valloc, pvalloc, gs_malloc, gs_calloc,
 * gs_aligned_alloc and gs_cache_alloc, each with small and large blocks:
 *   - the failure is NULL with errno = ENOMEM (posix_memalign returns
 *     ENOMEM), never a crash, and a failed realloc leaves the block intact;
 *   - no live block is damaged while memory runs out (content patterns);
 *   - recovery: once everything is freed, the same entry point gets (nearly)
 *     as much memory as the first time, and then blocks of the other kind
 *     (large after small, small after large) get at least half the limit;
 *   - several threads running out of memory at once: same guarantees.
 * Each scenario runs in a re-executed child with the option in its
 * environment (see gst_exec_self in tests/common.h).
 */
#include "include/graceslab.h"
#include "tests/common.h"

#include <criterion/criterion.h>

#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef __clang__
#pragma GCC diagnostic ignored "-Wuse-after-free"
#endif

void *reallocarray(void *p, size_t n, size_t size);
void *valloc(size_t size);
void *pvalloc(size_t size);

#define LIMIT_MB "32"
#define LIMIT ((size_t)32 << 20)
#define MAX_PTRS ((size_t)1 << 20)
#define SMALL 64
#define LARGE ((size_t)320 << 10) /* above the largest slab class, 256 KiB */

/* ------------------------------------------------------- entry points */

/* Each entry allocates `size` bytes (at least) its own way; NULL on
   failure with errno as the entry point left it (posix_memalign: its
   return value). */
static struct gs_cache *cache;
static size_t cache_size;

static void *e_malloc(size_t n) { return malloc(n); }
static void *e_calloc(size_t n) { return calloc(n / 16, 16); }
static void *e_aligned_alloc(size_t n) { return aligned_alloc(n > 4096 ? 65536 : 64, n); }
static void *e_memalign(size_t n) { return memalign(n > 4096 ? 1 << 20 : 256, n); }
static void *e_valloc(size_t n) { return valloc(n); }
static void *e_pvalloc(size_t n) { return pvalloc(n); }
static void *e_reallocarray(size_t n) { return reallocarray(NULL, n / 16, 16); }
static void *e_gs_malloc(size_t n) { return gs_malloc(n); }
static void *e_gs_calloc(size_t n) { return gs_calloc(1, n); }
static void *e_gs_aligned_alloc(size_t n) { return gs_aligned_alloc(n > 4096 ? 4096 : 32, n); }
static void *e_cache(size_t n)
{
    GST_CHILD_CHECK(n == cache_size, "cache of %zu B asked for %zu", cache_size, n);
    return gs_cache_alloc(cache);
}
static void *e_posix_memalign(size_t n)
{
    void *p = NULL;
    int saved = errno;
    int r = posix_memalign(&p, n > 4096 ? 8192 : 128, n);
    if (r) {
        GST_CHILD_CHECK(r == ENOMEM, "posix_memalign returned %d, expected ENOMEM", r);
        GST_CHILD_CHECK(errno == saved, "posix_memalign changed errno to %d", errno);
        errno = ENOMEM;
        return NULL;
    }
    return p;
}

static const struct entry {
    const char *name;
    void *(*alloc)(size_t);
    size_t align; /* the alignment the entry promises for small/large */
    size_t align_large;
    bool zeroed;
} entries[] = {
    {"malloc", e_malloc, 16, 16, false},
    {"calloc", e_calloc, 16, 16, true},
    {"aligned_alloc", e_aligned_alloc, 64, 65536, false},
    {"posix_memalign", e_posix_memalign, 128, 8192, false},
    {"memalign", e_memalign, 256, 1 << 20, false},
    {"valloc", e_valloc, 4096, 4096, false},
    {"pvalloc", e_pvalloc, 4096, 4096, false},
    {"reallocarray", e_reallocarray, 16, 16, false},
    {"gs_malloc", e_gs_malloc, 16, 16, false},
    {"gs_calloc", e_gs_calloc, 16, 16, true},
    {"gs_aligned_alloc", e_gs_aligned_alloc, 32, 4096, false},
    {"gs_cache_alloc", e_cache, 16, 16, false},
};

static void release(void *p)
{
    if (cache)
        gs_cache_free(cache, p);
    else
        free(p);
}

/* ------------------------------------------------------------- filling */

/* Fills memory with blocks from e until it fails; checks the failure, the
   alignment, zeroing, and that every block keeps its pattern. Returns the
   number of blocks. */
static size_t fill(const struct entry *e, size_t size, void **ptrs)
{
    size_t align = size > 4096 ? e->align_large : e->align;
    size_t n = 0;
    for (;; n++) {
        GST_CHILD_CHECK(n < MAX_PTRS, "%s(%zu) never failed: is GRACESLAB_OS_FAIL_AFTER_MB set?",
                        e->name, size);
        errno = 0;
        void *p = e->alloc(size);
        if (!p) {
            GST_CHILD_CHECK(errno == ENOMEM, "%s(%zu) failed with errno %d, not ENOMEM",
                            e->name, size, errno);
            break;
        }
        GST_CHILD_CHECK((uintptr_t)p % align == 0, "%s(%zu) = %p not %zu-aligned", e->name,
                        size, p, align);
        GST_CHILD_CHECK(gs_usable_size(p) >= size, "%s(%zu): usable size %zu", e->name, size,
                        gs_usable_size(p));
        if (e->zeroed) {
            const unsigned char *b = p;
            for (size_t i = 0; i < size; i += 61)
                GST_CHILD_CHECK(b[i] == 0, "%s(%zu): byte %zu is %#x", e->name, size, i, b[i]);
        }
        gst_fill(p, size < 256 ? size : 256, (uintptr_t)n);
        ptrs[n] = p;
    }
    /* More calls at the limit: each fails the same way or (if the allocator
       found memory to give back) succeeds; none crashes. */
    for (int k = 0; k < 50; k++) {
        errno = 0;
        void *p = e->alloc(size);
        if (p) {
            gst_fill(p, size < 256 ? size : 256, (uintptr_t)n);
            ptrs[n++] = p;
        } else {
            GST_CHILD_CHECK(errno == ENOMEM, "%s(%zu): errno %d", e->name, size, errno);
        }
    }
    for (size_t i = 0; i < n; i++) {
        size_t bad = gst_check(ptrs[i], size < 256 ? size : 256, (uintptr_t)i);
        GST_CHILD_CHECK(bad == (size < 256 ? size : 256),
                        "%s: block %zu (%p) damaged at byte %zu while memory ran out", e->name, i,
                        ptrs[i], bad);
    }
    return n;
}

static void free_all(void **ptrs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        release(ptrs[i]);
}

/* After everything is freed, blocks of the other kind fit: at least half
   the limit's worth, through plain malloc. */
static void other_kind_fits(const char *what, size_t size, void **ptrs)
{
    size_t other = size > (256 << 10) ? SMALL : LARGE;
    size_t m = 0;
    while (m * other < LIMIT / 2 && (ptrs[m] = malloc(other)) != NULL) {
        memset(ptrs[m], 0x3c, other < 4096 ? other : 4096);
        m++;
    }
    GST_CHILD_CHECK(m * other >= LIMIT / 2,
                    "%s: after freeing everything only %zu x %zu B fit (errno %d); "
                    "memory did not come back",
                    what, m, other, errno);
    for (size_t i = 0; i < m; i++)
        free(ptrs[i]);
}

static void entry_scenario(const struct entry *e, size_t size)
{
    void **ptrs = gst_raw_array(MAX_PTRS);
    GST_CHILD_CHECK(ptrs != NULL, "mmap");
    if (e->alloc == e_cache) {
        cache_size = size;
        cache = gs_cache_create("oom", size, 0, 0);
        GST_CHILD_CHECK(cache != NULL, "gs_cache_create(%zu): errno %d", size, errno);
    }
    size_t n = fill(e, size, ptrs);
    /* Each block takes at least its size rounded up to its alignment. */
    size_t align = size > 4096 ? e->align_large : e->align;
    size_t each = (size + align - 1) / align * align;
    GST_CHILD_CHECK(n * each >= LIMIT / 4, "%s(%zu): only %zu blocks before the failure",
                    e->name, size, n);
    free_all(ptrs, n);
    /* Recovery, same entry point. */
    size_t n2 = fill(e, size, ptrs);
    GST_CHILD_CHECK(n2 >= n - n / 10, "%s(%zu): %zu blocks the first time, %zu after freeing "
                                      "them all",
                    e->name, size, n, n2);
    free_all(ptrs, n2);
    if (cache) {
        gs_cache_destroy(cache);
        cache = NULL;
    }
    other_kind_fits(e->name, size, ptrs);
}

/* realloc and reallocarray growing every block of a full heap: each call
   either moves/grows the block with its contents or fails with NULL +
   ENOMEM leaving the block as it was. */
static void grow_scenario(bool array, size_t size)
{
    const char *name = array ? "reallocarray" : "realloc";
    void **ptrs = gst_raw_array(MAX_PTRS);
    GST_CHILD_CHECK(ptrs != NULL, "mmap");
    size_t n = 0;
    while (n < MAX_PTRS && (ptrs[n] = malloc(size)) != NULL) {
        gst_fill(ptrs[n], size < 256 ? size : 256, (uintptr_t)n);
        n++;
    }
    GST_CHILD_CHECK(n * size >= LIMIT / 4, "only %zu blocks of %zu B", n, size);
    /* Make room for some of the growth, not all of it: free the older
       half (whole slabs become empty and serve the larger class). */
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (i < n / 2) {
            free(ptrs[i]);
        } else {
            ptrs[kept] = ptrs[i];
            gst_fill(ptrs[kept], size < 256 ? size : 256, (uintptr_t)kept);
            kept++;
        }
    }
    size_t grown = 0, failed = 0;
    for (size_t i = 0; i < kept; i++) {
        errno = 0;
        void *q = array ? reallocarray(ptrs[i], 4, size) : realloc(ptrs[i], 4 * size);
        size_t chk = size < 256 ? size : 256;
        if (q) {
            size_t bad = gst_check(q, chk, (uintptr_t)i);
            GST_CHILD_CHECK(bad == chk, "%s grown block %zu lost its contents at byte %zu", name,
                            i, bad);
            GST_CHILD_CHECK(gs_usable_size(q) >= 4 * size, "%s: usable %zu", name,
                            gs_usable_size(q));
            memset((char *)q + size, 0x77, 3 * size);
            ptrs[i] = q;
            grown++;
        } else {
            GST_CHILD_CHECK(errno == ENOMEM, "%s failed with errno %d", name, errno);
            size_t bad = gst_check(ptrs[i], chk, (uintptr_t)i);
            GST_CHILD_CHECK(bad == chk, "failed %s damaged block %zu at byte %zu", name, i, bad);
            GST_CHILD_CHECK(gs_usable_size(ptrs[i]) >= size, "failed %s shrank block %zu", name,
                            i);
            failed++;
        }
    }
    GST_CHILD_CHECK(failed > 0, "%s: all %zu blocks grew 4x in a full heap", name, kept);
    GST_CHILD_CHECK(grown > 0, "%s: no block could grow after half were freed", name);
    free_all(ptrs, kept);
    /* Recovery: now every block grows. */
    for (size_t i = 0; i < kept / 4; i++) {
        ptrs[i] = malloc(size);
        GST_CHILD_CHECK(ptrs[i] != NULL, "malloc after recovery (block %zu)", i);
        void *q = array ? reallocarray(ptrs[i], 4, size) : realloc(ptrs[i], 4 * size);
        GST_CHILD_CHECK(q != NULL, "%s after recovery (block %zu): errno %d", name, i, errno);
        ptrs[i] = q;
    }
    free_all(ptrs, kept / 4);
    other_kind_fits(name, size, ptrs);
}

/* Several threads run out of memory at once, with mixed sizes. */
#define NTHREADS 4

static void *thread_fill(void *arg)
{
    uint64_t seed = (uintptr_t)arg + 1;
    void **ptrs = gst_raw_array(MAX_PTRS);
    GST_CHILD_CHECK(ptrs != NULL, "mmap");
    size_t n = 0;
    for (int failures = 0; failures < 20;) {
        size_t size = gst_rand(&seed) % 4 == 0 ? 4096 + gst_rand(&seed) % LARGE
                                                : 16 + gst_rand(&seed) % 2000;
        errno = 0;
        void *p = malloc(size);
        if (!p) {
            GST_CHILD_CHECK(errno == ENOMEM, "thread malloc(%zu): errno %d", size, errno);
            failures++;
            continue;
        }
        GST_CHILD_CHECK(n < MAX_PTRS, "thread: never ran out of memory");
        *(size_t *)p = size;
        gst_fill((char *)p + sizeof(size_t), 64 < size - sizeof(size_t) ? 64 : 0, (uintptr_t)p);
        ptrs[n++] = p;
    }
    for (size_t i = 0; i < n; i++) {
        size_t size = *(size_t *)ptrs[i];
        size_t chk = 64 < size - sizeof(size_t) ? 64 : 0;
        size_t bad = gst_check((char *)ptrs[i] + sizeof(size_t), chk, (uintptr_t)ptrs[i]);
        GST_CHILD_CHECK(bad == chk, "thread block %p (%zu B) damaged at %zu", ptrs[i], size, bad);
        free(ptrs[i]);
    }
    munmap(ptrs, MAX_PTRS * sizeof(void *));
    return (void *)n;
}

static void threads_scenario(void)
{
    pthread_t t[NTHREADS];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < NTHREADS; i++)
            GST_CHILD_CHECK(pthread_create(&t[i], NULL, thread_fill, (void *)(uintptr_t)i) == 0,
                            "pthread_create");
        /* Each thread ran until 20 failures, all ENOMEM (thread_fill
           checks). Not each thread need get a block: one that starts after
           the others took the whole limit rightly gets none (a scheduling
           accident, seen about once in 60 runs); the threads together
           must. */
        size_t total = 0;
        for (int i = 0; i < NTHREADS; i++) {
            void *n;
            pthread_join(t[i], &n);
            total += (size_t)n;
        }
        GST_CHILD_CHECK(total > 0, "round %d: no thread allocated anything", round);
    }
    void **ptrs = gst_raw_array(MAX_PTRS);
    GST_CHILD_CHECK(ptrs != NULL, "mmap");
    other_kind_fits("threads", SMALL, ptrs);
    other_kind_fits("threads", LARGE, ptrs);
}

/* The first allocations of a process are aligned ones (no malloc before):
   small aligned blocks still come from slabs, not one mapping each. Found
   with the OOM scenarios: 8192 aligned_alloc(64, 64) blocks filled 32 MiB. */
static void aligned_first_scenario(void)
{
    enum { N = 1000 };
    void **ptrs = gst_raw_array(N);
    GST_CHILD_CHECK(ptrs != NULL, "mmap");
    for (int i = 0; i < N; i++) {
        ptrs[i] = aligned_alloc(64, 64);
        GST_CHILD_CHECK(ptrs[i] != NULL && (uintptr_t)ptrs[i] % 64 == 0, "aligned_alloc");
    }
    struct gs_stats st;
    gs_stats_get(&st);
    GST_CHILD_CHECK(st.large_bytes < (size_t)N * 64,
                    "%d aligned_alloc(64, 64) as the first allocations of the process: "
                    "%zu bytes in large blocks (one mapping per block), %zu mapped",
                    N, st.large_bytes, st.mapped_bytes);
    /* One segment (4 MiB, the smallest mapping slabs come from) plus the
       heap's own pages. */
    GST_CHILD_CHECK(st.segments == 1 && st.mapped_bytes < ((size_t)4 << 20) + (1 << 20),
                    "%d x 64 B blocks take %zu B of mappings, %zu segments", N,
                    st.mapped_bytes, st.segments);
    for (int i = 0; i < N; i++)
        free(ptrs[i]);
}

/* -------------------------------------------------- re-executed child */

__attribute__((constructor)) static void child_mode(void)
{
    const char *m = getenv("GS_OOM_CHILD");
    if (!m)
        return;
    if (!strcmp(m, "huge_limit")) {
        /* GRACESLAB_OS_FAIL_AFTER_MB=2^44: scaled to bytes it wrapped to
           a 0-byte limit, and every allocation failed. */
        void *a = malloc(SMALL), *b = malloc(LARGE);
        GST_CHILD_CHECK(a && b, "allocation failed under a 2^44 MiB limit");
        _exit(0);
    }
    if (!strcmp(m, "aligned_first")) {
        aligned_first_scenario();
        _exit(0);
    }
    /* A program has allocated before it runs out of memory (and see
       aligned_first_scenario). */
    free(malloc(1));
    if (!strcmp(m, "threads")) {
        threads_scenario();
        _exit(0);
    }
    /* "<entry>_small" or "<entry>_large" */
    const char *us = strrchr(m, '_');
    GST_CHILD_CHECK(us != NULL, "bad GS_OOM_CHILD=%s", m);
    size_t len = (size_t)(us - m);
    size_t size = !strcmp(us, "_large") ? LARGE : SMALL;
    if (!strncmp(m, "gs_cache_alloc", len) && size == LARGE)
        size = 32768; /* the largest cache object */
    if (!strncmp(m, "realloc_grow", len) && len == strlen("realloc_grow"))
        grow_scenario(false, size);
    else if (!strncmp(m, "reallocarray_grow", len) && len == strlen("reallocarray_grow"))
        grow_scenario(true, size);
    else {
        size_t i = 0;
        while (i < sizeof entries / sizeof entries[0] &&
               !(strlen(entries[i].name) == len && !strncmp(entries[i].name, m, len)))
            i++;
        GST_CHILD_CHECK(i < sizeof entries / sizeof entries[0], "unknown GS_OOM_CHILD=%s", m);
        entry_scenario(&entries[i], size);
    }
    _exit(0);
}

static void run_mode(const char *mode)
{
    struct gst_exec_args a = {"GS_OOM_CHILD", mode,
                              {"GRACESLAB_OS_FAIL_AFTER_MB=" LIMIT_MB, NULL}};
    struct gst_child c;
    cr_assert(gst_run_child(gst_exec_self, &a, &c));
    GST_ASSERT_CHILD_OK(&c, mode);
}

#define OOM_TESTS(name)                                                        \
    Test(oom, name##_small, .timeout = 60) { run_mode(#name "_small"); }      \
    Test(oom, name##_large, .timeout = 60) { run_mode(#name "_large"); }

OOM_TESTS(malloc)
OOM_TESTS(calloc)
OOM_TESTS(realloc_grow)
OOM_TESTS(reallocarray_grow)
OOM_TESTS(aligned_alloc)
OOM_TESTS(posix_memalign)
OOM_TESTS(memalign)
OOM_TESTS(valloc)
OOM_TESTS(pvalloc)
OOM_TESTS(reallocarray)
OOM_TESTS(gs_malloc)
OOM_TESTS(gs_calloc)
OOM_TESTS(gs_aligned_alloc)
OOM_TESTS(gs_cache_alloc)

Test(oom, threads_at_once, .timeout = 60)
{
    run_mode("threads");
}

/* With no empty-slab cache at all (every emptied slab decommitted at once,
   no heap keeps any), the memory a failed allocation can win back is the
   empty segments the reclaim unmaps: it must count them, or the
   allocation fails for good while memory is free (only 12 of 320 KiB blocks fit
   after freeing 32 MiB of small ones: the reclaim reported 0 bytes). */
static void run_mode_no_cache(const char *mode)
{
    struct gst_exec_args a = {"GS_OOM_CHILD", mode,
                              {"GRACESLAB_OS_FAIL_AFTER_MB=" LIMIT_MB, "GRACESLAB_EMPTY_CACHE_MB=0",
                               "GRACESLAB_HEAP_EMPTY_KB=0", NULL}};
    struct gst_child c;
    cr_assert(gst_run_child(gst_exec_self, &a, &c));
    GST_ASSERT_CHILD_OK(&c, mode);
}

Test(oom_no_empty_cache, malloc_small, .timeout = 60) { run_mode_no_cache("malloc_small"); }
Test(oom_no_empty_cache, gs_cache_alloc_large, .timeout = 60)
{
    run_mode_no_cache("gs_cache_alloc_large");
}
Test(oom_no_empty_cache, realloc_grow_small, .timeout = 60)
{
    run_mode_no_cache("realloc_grow_small");
}
Test(oom_no_empty_cache, threads_at_once, .timeout = 60) { run_mode_no_cache("threads"); }

Test(fresh_process, aligned_alloc_first_uses_slabs, .timeout = 60)
{
    run_mode("aligned_first");
}

/* An option value too large to scale (here 2^44 MiB) means "very large",
   not whatever its scaled bytes wrapped to. */
Test(oom, huge_limit_is_no_limit, .timeout = 60)
{
    struct gst_exec_args a = {"GS_OOM_CHILD", "huge_limit",
                              {"GRACESLAB_OS_FAIL_AFTER_MB=17592186044416", NULL}};
    struct gst_child c;
    cr_assert(gst_run_child(gst_exec_self, &a, &c));
    GST_ASSERT_CHILD_OK(&c, "huge_limit");
}
