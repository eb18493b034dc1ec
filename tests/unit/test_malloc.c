/*
 * glibc malloc semantics, one by one, through the exported names
 * (alloc/malloc.c). Linked with libgraceslab.so like a program; built with
 * -fno-builtin so every call reaches the allocator.
 */
#include <criterion/criterion.h>

#include "graceslab.h"
#include "../common.h"

#include <dlfcn.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>
#include <valgrind/valgrind.h>

/* The point of several tests is to pass impossible sizes and to look at a
   block after a realloc that must have failed. */
#ifndef __clang__
#pragma GCC diagnostic ignored "-Walloc-size-larger-than="
#pragma GCC diagnostic ignored "-Wuse-after-free"
#endif

/* Not declared by every libc version. */
void free_sized(void *p, size_t size);
void free_aligned_sized(void *p, size_t alignment, size_t size);
void *reallocarray(void *p, size_t n, size_t size);
void *__libc_malloc(size_t size);
void __libc_free(void *p);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);
void *__libc_memalign(size_t alignment, size_t size);
void *__libc_valloc(size_t size);
void *__libc_pvalloc(size_t size);
struct mallinfo __libc_mallinfo(void);
void cfree(void *p);

#define TOO_BIG ((size_t)PTRDIFF_MAX + 1)
#define PAGE ((size_t)sysconf(_SC_PAGESIZE))

static size_t live_bytes(void)
{
    struct gs_stats st;
    gs_stats_get(&st);
    return st.allocated_bytes;
}

/* ------------------------------------------------------------ malloc */

Test(malloc, zero_size_unique_non_null)
{
    enum { N = 200 };
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = malloc(0);
        cr_assert_not_null(p[i]);
        for (int j = 0; j < i; j++)
            cr_assert_neq(p[i], p[j], "malloc(0) returned %p twice", p[i]);
    }
    for (int i = 0; i < N; i++)
        free(p[i]);
}

/* Every size from 0 to 64 KiB, then large ones: 16-aligned, usable size
   at least the request, the whole usable range writable. */
Test(malloc, alignment_and_usable_size_every_size)
{
    for (size_t size = 0; size <= 65536; size++) {
        unsigned char *p = malloc(size);
        cr_assert_not_null(p, "malloc(%zu)", size);
        cr_assert_eq((uintptr_t)p % 16, 0, "malloc(%zu) = %p", size, p);
        size_t u = malloc_usable_size(p);
        cr_assert_geq(u, size, "malloc_usable_size %zu < %zu", u, size);
        if (u) {
            p[0] = 1;
            p[u - 1] = 2;
        }
        free(p);
    }
    static const size_t large[] = {(1 << 20) - 1, 1 << 20, (5 << 20) + 3, (100 << 20) + 1};
    for (size_t i = 0; i < sizeof large / sizeof large[0]; i++) {
        unsigned char *p = malloc(large[i]);
        cr_assert_not_null(p);
        cr_assert_eq((uintptr_t)p % 16, 0);
        cr_assert_geq(malloc_usable_size(p), large[i]);
        p[large[i] - 1] = 1;
        free(p);
    }
    cr_assert_eq(malloc_usable_size(NULL), 0);
}

/* Live blocks of all sizes hold their contents up to the usable size. */
Test(malloc, blocks_hold_contents)
{
    enum { N = 3000 };
    static unsigned char *p[N];
    uint64_t rng = 1;
    for (int i = 0; i < N; i++) {
        size_t size = gst_rand(&rng) % 70000;
        p[i] = malloc(size);
        gst_fill(p[i], malloc_usable_size(p[i]), (uintptr_t)i);
    }
    for (int i = 0; i < N; i++) {
        size_t u = malloc_usable_size(p[i]);
        cr_assert_eq(gst_check(p[i], u, (uintptr_t)i), u, "block %d corrupted", i);
        free(p[i]);
    }
}

Test(malloc, failures_return_null_enomem)
{
    errno = 0;
    cr_assert_null(malloc(TOO_BIG));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(malloc(SIZE_MAX));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(malloc(PTRDIFF_MAX));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(malloc(SIZE_MAX - 4096));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(calloc(SIZE_MAX / 2, 3), "calloc overflow");
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(calloc((size_t)1 << 32, (size_t)1 << 32), "calloc overflow to 0");
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(calloc(1, TOO_BIG));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(reallocarray(NULL, SIZE_MAX / 2, 3));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(aligned_alloc(64, SIZE_MAX));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(aligned_alloc(1 << 20, TOO_BIG));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(memalign(4096, SIZE_MAX - 100));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(valloc(SIZE_MAX));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(pvalloc(SIZE_MAX - 100), "pvalloc rounding overflow");
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(pvalloc(TOO_BIG));
    cr_assert_eq(errno, ENOMEM);
    void *out = (void *)0x1234;
    cr_assert_eq(posix_memalign(&out, 64, SIZE_MAX), ENOMEM);
    cr_assert_eq(out, (void *)0x1234, "posix_memalign touched *p on failure");
}

/* ------------------------------------------------------------ free */

static void *free_in_thread(void *arg)
{
    errno = 4321;
    free(arg);
    return (void *)(intptr_t)errno;
}

Test(malloc, free_preserves_errno)
{
    void *small = malloc(40), *large = malloc(1 << 20), *big = malloc(64 << 20);
    void *keep = malloc(40);
    errno = 1234;
    free(NULL);
    cr_assert_eq(errno, 1234);
    free(small);
    cr_assert_eq(errno, 1234, "free of a small block changed errno");
    free(large);
    cr_assert_eq(errno, 1234, "free of a large block changed errno");
    free(big); /* unmapped at once */
    cr_assert_eq(errno, 1234, "free of an unmapped large block changed errno");
    /* A free from another thread (remote path). */
    pthread_t t;
    void *ret;
    pthread_create(&t, NULL, free_in_thread, keep);
    pthread_join(t, &ret);
    cr_assert_eq((intptr_t)ret, 4321, "remote free changed errno");
}

/* ------------------------------------------------------------ realloc */

Test(malloc, realloc_null_is_malloc)
{
    size_t before = live_bytes();
    char *p = realloc(NULL, 100);
    cr_assert_not_null(p);
    cr_assert_eq((uintptr_t)p % 16, 0);
    cr_assert_geq(malloc_usable_size(p), 100);
    cr_assert_geq(live_bytes(), before + 100);
    free(p);
    p = realloc(NULL, 0);
    cr_assert_not_null(p, "realloc(NULL, 0) is malloc(0)");
    free(p);
}

Test(malloc, realloc_zero_frees_and_returns_null)
{
    static const size_t sizes[] = {1, 100, 5000, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *keep = malloc(sizes[i]); /* the slab stays */
        size_t before = live_bytes();
        void *p = malloc(sizes[i]);
        cr_assert_gt(live_bytes(), before);
        errno = 0;
        cr_assert_null(realloc(p, 0));
        cr_assert_eq(live_bytes(), before, "realloc(p, 0) did not free p (size %zu)", sizes[i]);
        free(keep);
    }
}

Test(malloc, failed_realloc_leaves_block_intact)
{
    static const size_t sizes[] = {10, 1000, 30000, 100000, 5 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t size = sizes[i];
        unsigned char *p = malloc(size);
        gst_fill(p, size, size);
        errno = 0;
        cr_assert_null(realloc(p, TOO_BIG));
        cr_assert_eq(errno, ENOMEM);
        errno = 0;
        cr_assert_null(realloc(p, SIZE_MAX - 64));
        cr_assert_eq(errno, ENOMEM);
        errno = 0;
        cr_assert_null(reallocarray(p, SIZE_MAX / 4, 5));
        cr_assert_eq(errno, ENOMEM);
        cr_assert_eq(malloc_usable_size(p) >= size, 1);
        cr_assert_eq(gst_check(p, size, size), size, "size %zu: contents changed", size);
        free(p);
    }
}

/* With the kernel's default overcommit heuristic (vm.overcommit_memory
   0), a mapping larger than RAM and swap together is refused, and glibc's
   malloc returns NULL with ENOMEM: a program may try a big buffer and fall
   back. graceslab mapped with MAP_NORESERVE, which skips that check: the
   request succeeded and the program was killed when it touched it. */
Test(malloc, request_beyond_ram_and_swap_fails)
{
    FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
    int mode = -1;
    if (f) {
        if (fscanf(f, "%d", &mode) != 1)
            mode = -1;
        fclose(f);
    }
    if (mode == 1)
        cr_skip_test("vm.overcommit_memory is 1: the kernel grants any mapping");
    cr_assert(mode == 0 || mode == 2, "cannot read vm.overcommit_memory");
    struct sysinfo si;
    cr_assert_eq(sysinfo(&si), 0);
    size_t total = ((size_t)si.totalram + (size_t)si.totalswap) * si.mem_unit;
    size_t big = 2 * total;
    errno = 0;
    void *p = malloc(big);
    cr_assert_null(p, "malloc(%zu) (twice RAM + swap) succeeded", big);
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(calloc(2, total));
    cr_assert_eq(errno, ENOMEM);
    char *q = malloc(1 << 20);
    gst_fill(q, 1 << 20, 5);
    errno = 0;
    cr_assert_null(realloc(q, big));
    cr_assert_eq(errno, ENOMEM);
    cr_assert_eq(gst_check(q, 1 << 20, 5), (size_t)1 << 20);
    free(q);
}

Test(malloc, realloc_within_usable_does_not_move)
{
    static const size_t sizes[] = {1, 17, 100, 1000, 4000, 32768, 40000, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char *p = malloc(sizes[i]);
        size_t u = malloc_usable_size(p);
        gst_fill(p, sizes[i], 3);
        cr_assert_eq(realloc(p, u), p, "realloc to usable size %zu moved (size %zu)", u,
                     sizes[i]);
        cr_assert_eq(realloc(p, sizes[i] + (u - sizes[i]) / 2), p);
        cr_assert_eq(gst_check(p, sizes[i], 3), sizes[i]);
        free(p);
    }
}

/* A slab block that grows a little out of its class moves to one with a
   quarter more room than it had (malloc.c), so the next small growth stays
   in place; a larger jump, and a large block, get malloc's size. */
Test(malloc, realloc_growth_leaves_room)
{
    static const size_t sizes[] = {16, 100, 1000, 4000, 30000, 100000, 200000, 262144};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char *p = malloc(sizes[i]);
        size_t u = malloc_usable_size(p), n = u + 1;
        gst_fill(p, u, 4);
        char *q = realloc(p, n);
        cr_assert_not_null(q);
        size_t want = u + u / 4;
        if (n <= 262144 && want > 262144)
            want = 262144;
        cr_assert_geq(malloc_usable_size(q), want, "realloc(%zu) of a %zu-byte block: %zu usable",
                      n, u, malloc_usable_size(q));
        cr_assert_eq(gst_check(q, u, 4), u);
        cr_assert_eq(realloc(q, want), q, "growth within the room moved");
        free(q);
        /* Twice the size: no room beyond the class malloc gives. */
        p = malloc(sizes[i]);
        q = realloc(p, 2 * u);
        char *r = malloc(2 * u);
        cr_assert_eq(malloc_usable_size(q), malloc_usable_size(r), "realloc(%zu)", 2 * u);
        free(q);
        free(r);
    }
}

Test(malloc, realloc_moves_keep_contents)
{
    uint64_t rng = 7;
    size_t size = 1;
    unsigned char *p = malloc(size);
    gst_fill(p, size, 99);
    for (int i = 0; i < 300; i++) {
        size_t next = 1 + gst_rand(&rng) % (i % 10 == 9 ? (4 << 20) : 70000);
        unsigned char *q = realloc(p, next);
        cr_assert_not_null(q);
        size_t keep = size < next ? size : next;
        cr_assert_eq(gst_check(q, keep, 99), keep, "realloc %zu -> %zu lost contents", size,
                     next);
        gst_fill(q, next, 99);
        p = q;
        size = next;
    }
    free(p);
}

Test(malloc, reallocarray_works)
{
    int *a = reallocarray(NULL, 10, sizeof(int));
    cr_assert_not_null(a);
    for (int i = 0; i < 10; i++)
        a[i] = i;
    a = reallocarray(a, 1000, sizeof(int));
    cr_assert_not_null(a);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(a[i], i);
    free(a);
}

/* ------------------------------------------------------------ aligned */

Test(malloc, posix_memalign_bad_alignment)
{
    static const size_t bad[] = {0, 1, 2, 4, 3, 12, 24, 48, 100, 4097, ((size_t)1 << 63) + 8};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void *p = (void *)0x5678;
        errno = 77;
        cr_assert_eq(posix_memalign(&p, bad[i], 16), EINVAL, "alignment %zu", bad[i]);
        cr_assert_eq(p, (void *)0x5678, "alignment %zu: *p touched", bad[i]);
        cr_assert_eq(errno, 77, "posix_memalign set errno");
    }
    static const size_t bad_aligned_alloc[] = {0, 3, 24, 48, 100, 4097};
    for (size_t i = 0; i < sizeof bad_aligned_alloc / sizeof bad_aligned_alloc[0]; i++) {
        errno = 0;
        cr_assert_null(aligned_alloc(bad_aligned_alloc[i], 64));
        cr_assert_eq(errno, EINVAL, "aligned_alloc(%zu)", bad_aligned_alloc[i]);
    }
}

static void check_aligned(void *p, size_t align, size_t size, const char *what)
{
    cr_assert_not_null(p, "%s(%zu, %zu)", what, align, size);
    cr_assert_eq((uintptr_t)p % align, 0, "%s(%zu, %zu) = %p", what, align, size, p);
    size_t u = malloc_usable_size(p);
    cr_assert_geq(u, size, "%s(%zu, %zu): usable %zu", what, align, size, u);
    if (size) {
        ((char *)p)[0] = 1;
        ((char *)p)[size - 1] = 1;
    }
}

/* Every power-of-two alignment from 16 to 64 MiB, through every API. */
Test(malloc, aligned_every_alignment)
{
    for (size_t align = 16; align <= ((size_t)64 << 20); align *= 2) {
        size_t sizes[] = {1, 100, align - 1, align, align + 1, 3 * align / 2, 40000};
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            size_t size = sizes[i];
            void *p = aligned_alloc(align, size);
            check_aligned(p, align, size, "aligned_alloc");
            void *q = memalign(align, size);
            check_aligned(q, align, size, "memalign");
            void *r = (void *)1;
            cr_assert_eq(posix_memalign(&r, align, size), 0);
            check_aligned(r, align, size, "posix_memalign");
            cr_assert_neq(p, q);
            cr_assert_neq(q, r);
            free(p);
            free(q);
            free(r);
        }
    }
    /* posix_memalign also takes 8 (sizeof(void *)). */
    void *p;
    cr_assert_eq(posix_memalign(&p, 8, 24), 0);
    check_aligned(p, 8, 24, "posix_memalign");
    free(p);
}

/* An aligned block of up to 32 KiB comes from the class malloc picks for
   its size rounded up to the alignment: the same usable size, on both
   sides of 1 KiB, where the fast path chooses between two indexes of
   malloc's table without a branch. Each pair is asked for twice, so the
   second comes from the thread's active slab (the fast path). */
Test(malloc, aligned_same_class_as_rounded_malloc)
{
    for (size_t align = 16; align <= 32768; align *= 2) {
        for (size_t size = 1; size <= 33000; size += size < 1200 ? 1 : 61) {
            size_t want = ((size < align ? align : size) + align - 1) & ~(align - 1);
            if (want > 32768)
                break;
            void *m = malloc(want);
            size_t expect = malloc_usable_size(m);
            for (int k = 0; k < 2; k++) {
                void *p = NULL;
                cr_assert_eq(posix_memalign(&p, align, size), 0);
                check_aligned(p, align, size, "posix_memalign");
                cr_assert_eq(malloc_usable_size(p), expect,
                             "posix_memalign(%zu, %zu): usable %zu, malloc(%zu) has %zu", align,
                             size, malloc_usable_size(p), want, expect);
                void *q = aligned_alloc(align, size);
                check_aligned(q, align, size, "aligned_alloc");
                cr_assert_eq(malloc_usable_size(q), expect, "aligned_alloc(%zu, %zu)", align,
                             size);
                free(q);
                free(p);
            }
            free(m);
        }
    }
}

/* Size 0 with any alignment: a unique pointer that can be freed. */
Test(malloc, aligned_zero_size_every_alignment)
{
    for (size_t align = 16; align <= ((size_t)64 << 20); align *= 2) {
        void *p = aligned_alloc(align, 0);
        check_aligned(p, align, 0, "aligned_alloc");
        void *q = memalign(align, 0);
        check_aligned(q, align, 0, "memalign");
        void *r = NULL;
        cr_assert_eq(posix_memalign(&r, align, 0), 0);
        check_aligned(r, align, 0, "posix_memalign");
        cr_assert(p != q && q != r && p != r, "align %zu: size-0 blocks not unique", align);
        free(p);
        free(q);
        free(r);
    }
}

/* Called through a volatile pointer: the alignments below are invalid on
   purpose, and a compiler that trusts memalign's alloc_align attribute
   warns about them (clang) or crashes on alignment 0 (clang 14). */
static void *(*volatile memalign_call)(size_t, size_t) = memalign;

Test(malloc, memalign_rounds_odd_alignment)
{
    void *p = memalign_call(24, 100);
    check_aligned(p, 32, 100, "memalign");
    free(p);
    p = memalign_call(0, 100);
    check_aligned(p, 16, 100, "memalign");
    free(p);
    p = __libc_memalign(3000, 10);
    check_aligned(p, 4096, 10, "__libc_memalign");
    free(p);
}

Test(malloc, valloc_pvalloc)
{
    static const size_t sizes[] = {0, 1, 100, 4095, 4096, 4097, 100000, 3 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t size = sizes[i];
        void *v = valloc(size);
        check_aligned(v, PAGE, size, "valloc");
        void *pv = pvalloc(size);
        size_t rounded = size ? (size + PAGE - 1) / PAGE * PAGE : PAGE;
        check_aligned(pv, PAGE, rounded, "pvalloc");
        free(v);
        free(pv);
    }
}

Test(malloc, aligned_blocks_hold_contents)
{
    enum { N = 400 };
    static unsigned char *p[N];
    static size_t sz[N];
    for (int i = 0; i < N; i++) {
        size_t align = (size_t)16 << (i % 12);
        sz[i] = (size_t)(i * 97) % 20000 + 1;
        p[i] = aligned_alloc(align, sz[i]);
        cr_assert_eq((uintptr_t)p[i] % align, 0);
        gst_fill(p[i], sz[i], (uintptr_t)i);
    }
    for (int i = 0; i < N; i++) {
        cr_assert_eq(gst_check(p[i], sz[i], (uintptr_t)i), sz[i], "aligned block %d corrupted", i);
        free(p[i]);
    }
}

/* ------------------------------------------------------------ other names */

Test(malloc, free_sized_and_free_aligned_sized)
{
    size_t before = live_bytes();
    void *p = malloc(100), *q = aligned_alloc(256, 1000), *r = malloc(1 << 20);
    void *s = aligned_alloc(1 << 16, 5);
    cr_assert_gt(live_bytes(), before);
    free_sized(p, 100);
    free_aligned_sized(q, 256, 1000);
    free_sized(r, 1 << 20);
    free_aligned_sized(s, 1 << 16, 5);
    free_sized(NULL, 0);
    cr_assert_eq(live_bytes(), before, "free_sized/free_aligned_sized did not free");
}

/* glibc's internal names are graceslab's too: gs_usable_size() would abort
   on a glibc pointer. */
Test(malloc, libc_aliases_are_graceslab)
{
    size_t before = live_bytes();
    char *p = __libc_malloc(100);
    cr_assert_not_null(p);
    cr_assert_geq(gs_usable_size(p), 100);
    cr_assert_gt(live_bytes(), before);
    char *z = __libc_calloc(10, 10);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(z[i], 0);
    memset(p, 'x', 100);
    p = __libc_realloc(p, 5000);
    cr_assert_eq(p[99], 'x');
    cr_assert_geq(gs_usable_size(p), 5000);
    __libc_free(p);
    cfree(z);
    void *a = __libc_memalign(256, 300), *v = __libc_valloc(100), *pv = __libc_pvalloc(100);
    cr_assert(a && v && pv);
    cr_assert_eq((uintptr_t)a % 256, 0);
    cr_assert_eq((uintptr_t)v % PAGE, 0);
    cr_assert_eq((uintptr_t)pv % PAGE, 0);
    cr_assert_geq(gs_usable_size(pv), PAGE, "pvalloc rounds up to a page");
    gs_free(a);
    gs_free(v);
    gs_free(pv);
    cr_assert_eq(live_bytes(), before);
    /* And the public names agree with the gs_ ones. */
    void *g = gs_malloc(10);
    cr_assert_eq(malloc_usable_size(g), gs_usable_size(g));
    free(g);
    void *m = malloc(10);
    gs_free(m);
    cr_assert_eq(live_bytes(), before);
}

/* ------------------------------------------------------------ calloc */

/* Resident bytes of [p, p + n) (whole pages inside it). */
static size_t resident_bytes(const void *p, size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi <= lo)
        return 0;
    unsigned char vec[1024];
    size_t pages = (hi - lo) / page, resident = 0;
    cr_assert_leq(pages, sizeof vec);
    cr_assert_eq(mincore((void *)lo, hi - lo, vec), 0);
    for (size_t i = 0; i < pages; i++)
        resident += vec[i] & 1;
    return resident * page;
}

static void assert_all_zero(const unsigned char *p, size_t size)
{
    for (size_t b = 0; b < size; b++)
        if (p[b])
            cr_assert_fail("calloc(1, %zu): byte %zu is %#x", size, b, p[b]);
}

/* n blocks of calloc(1, size), each checked all zero, then freed. */
static void calloc_all_zero(unsigned char **p, int n, size_t size)
{
    for (int k = 0; k < n; k++) {
        p[k] = calloc(1, size);
        cr_assert_not_null(p[k]);
        assert_all_zero(p[k], size);
    }
    for (int k = 0; k < n; k++)
        free(p[k]);
}

/* A medium block (above 32 KiB, up to 256 KiB) never handed out since its
   slab was made on fresh slots is zero already: calloc leaves its pages
   untouched, as glibc and jemalloc leave a fresh mapping's. Blocks handed
   out before are cleared. (Under memcheck every block is cleared.) */
Test(malloc, calloc_leaves_fresh_medium_blocks_untouched)
{
    enum { N = 8, SIZE = 100000 };
    unsigned char *p[N];
    for (int k = 0; k < N; k++) {
        p[k] = calloc(1, SIZE);
        cr_assert_not_null(p[k]);
        size_t r = resident_bytes(p[k], SIZE);
        if (!RUNNING_ON_VALGRIND)
            cr_assert_lt(r, SIZE / 2, "fresh calloc(1, %d) #%d: %zu bytes resident", SIZE, k, r);
        assert_all_zero(p[k], SIZE);
        memset(p[k], 0xC3, malloc_usable_size(p[k]));
    }
    for (int k = 0; k < N; k++)
        free(p[k]);
    calloc_all_zero(p, N, SIZE);
}

Test(malloc, calloc_zeroes_reused_memory)
{
    static const size_t sizes[] = {1, 16, 64, 100, 1000, 4000, 32768, 40000, 1 << 20,
                                   (3 << 20) + 5};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t size = sizes[i];
        enum { N = 50 };
        unsigned char *p[N];
        for (int k = 0; k < N; k++) {
            p[k] = malloc(size);
            memset(p[k], 0xAB, malloc_usable_size(p[k]));
        }
        for (int k = 0; k < N; k++)
            free(p[k]);
        calloc_all_zero(p, N, size);
    }
    void *z = calloc(0, 10);
    cr_assert_not_null(z);
    free(z);
    z = calloc(10, 0);
    cr_assert_not_null(z);
    free(z);
}

/* ------------------------------------------- glibc's malloc extensions */

#ifndef __clang__
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* mallinfo */
#else
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
#endif

/* Freed memory that graceslab keeps for reuse (the thread's empty slabs,
   committed empty slabs, up to GRACESLAB_EMPTY_CACHE_MB) goes back to the
   OS at malloc_trim, not one purge delay later (meson runs this program
   with GRACESLAB_PURGE_DELAY_MS=600000, so only the trim can give it). */
Test(malloc, malloc_trim_gives_kept_memory_back)
{
    enum { N = (40 << 20) / 64 };
    void **v = malloc(N * sizeof *v);
    cr_assert_not_null(v);
    for (size_t i = 0; i < N; i++) {
        v[i] = malloc(64);
        cr_assert_not_null(v[i]);
        memset(v[i], 0x5a, 64); /* resident */
    }
    for (size_t i = 0; i < N; i++)
        free(v[i]);
    struct gs_stats before, after;
    gs_stats_get(&before);
    size_t rss_before = gst_rss_bytes();
    cr_assert_eq(malloc_trim(0), 1, "nothing given back");
    gs_stats_get(&after);
    size_t rss_after = gst_rss_bytes();
    cr_assert_geq(before.committed_bytes - after.committed_bytes, (size_t)24 << 20,
                  "committed %zu -> %zu bytes", before.committed_bytes, after.committed_bytes);
    cr_assert_geq(rss_before - rss_after, (size_t)24 << 20, "RSS %zu -> %zu bytes",
                  rss_before, rss_after);
    cr_assert_eq(malloc_trim(0), 0, "a second trim found memory to give back");
    free(v);
}

Test(malloc, mallinfo2_counts_small_and_large_blocks)
{
    enum { N = 1024 };
    static void *small[N];
    struct mallinfo2 a = mallinfo2();
    for (int i = 0; i < N; i++)
        small[i] = malloc(1000);
    void *big = malloc(8 << 20);
    struct mallinfo2 b = mallinfo2();
    cr_assert_eq(b.uordblks - a.uordblks, (size_t)N * malloc_usable_size(small[0]));
    cr_assert_eq(b.hblkhd - a.hblkhd, malloc_usable_size(big));
    cr_assert_geq(b.arena, b.uordblks);
    struct mallinfo old = mallinfo();
    cr_assert_eq((size_t)old.uordblks, b.uordblks, "mallinfo and mallinfo2 disagree");
    cr_assert_eq((size_t)old.hblkhd, b.hblkhd);
    cr_assert_eq(__libc_mallinfo().uordblks, old.uordblks, "__libc_mallinfo is not graceslab's");
    for (int i = 0; i < N; i++)
        free(small[i]);
    free(big);
    struct mallinfo2 c = mallinfo2();
    cr_assert_eq(c.uordblks, a.uordblks);
    cr_assert_eq(c.hblkhd, a.hblkhd);
    cr_assert_geq(c.fordblks, (size_t)N * 1000, "freed blocks not counted free");
}

/* mallopt is graceslab's (a fully static program that calls it must link
   without glibc's malloc object; tests/unit/fully_static.c) and answers
   as glibc 2.36 does: 1, except 0 for a fast-bin limit outside 0..160.
   Outside memcheck, the test asks libc's own mallopt too and wants the
   same answers (that tunes glibc's unused arena, nothing else); memcheck
   replaces libc's mallopt with its own, which answers 1 to everything. */
static int glibc_236_mallopt(int param, int value)
{
    return param == M_MXFAST ? value >= 0 && value <= 160 : 1;
}

Test(malloc, mallopt_answers_as_glibc)
{
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(libc);
    int (*glibc_mallopt)(int, int) = (int (*)(int, int))dlsym(libc, "mallopt");
    cr_assert_not_null(glibc_mallopt);
    cr_assert_neq((void *)glibc_mallopt, (void *)mallopt, "mallopt is glibc's");
    bool ask_libc = !RUNNING_ON_VALGRIND;
    static const int params[] = {M_MXFAST,   M_TRIM_THRESHOLD, M_TOP_PAD,    M_MMAP_THRESHOLD,
                                 M_MMAP_MAX, M_CHECK_ACTION,   M_PERTURB,    M_ARENA_TEST,
                                 M_ARENA_MAX, 0,               12345,        -100};
    static const int values[] = {INT_MIN, -1, 0, 1, 64, 160, 161, 4096, 1 << 20, 32 << 20,
                                 (32 << 20) + 1, INT_MAX};
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++)
        for (size_t j = 0; j < sizeof values / sizeof values[0]; j++) {
            int ours = mallopt(params[i], values[j]);
            int want = glibc_236_mallopt(params[i], values[j]);
            cr_assert_eq(ours, want, "mallopt(%d, %d): %d, expected %d", params[i], values[j],
                         ours, want);
            if (ask_libc)
                cr_assert_eq(ours, glibc_mallopt(params[i], values[j]),
                             "mallopt(%d, %d): %d, libc's says otherwise", params[i], values[j],
                             ours);
        }
    if (ask_libc) {
        glibc_mallopt(M_PERTURB, 0);
        glibc_mallopt(M_CHECK_ACTION, 3);
    }
    dlclose(libc);
}

/* malloc_info: glibc's XML with graceslab's figures; options other than 0
   return EINVAL and leave errno alone, as glibc 2.36 does. */
static size_t xml_size(const char *xml, const char *element)
{
    const char *at = strstr(xml, element);
    cr_assert_not_null(at, "no %s in:\n%s", element, xml);
    const char *size = strstr(at, "size=\"");
    cr_assert_not_null(size);
    return strtoull(size + 6, NULL, 10);
}

Test(malloc, malloc_info_describes_graceslab)
{
    void *big = malloc(8 << 20);
    cr_assert_not_null(big);
    char *xml = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&xml, &len);
    cr_assert_not_null(f);
    cr_assert_eq(malloc_info(0, f), 0);
    fclose(f);
    cr_assert(strncmp(xml, "<malloc version=\"1\">", 20) == 0, "%s", xml);
    cr_assert_not_null(strstr(xml, "</malloc>"));
    cr_assert_eq(xml_size(xml, "<total type=\"mmap\""), mallinfo2().hblkhd);
    cr_assert_geq(xml_size(xml, "<total type=\"mmap\""), (size_t)8 << 20);
    struct gs_stats st;
    gs_stats_get(&st);
    cr_assert_geq(xml_size(xml, "<system type=\"current\""), (size_t)8 << 20);
    cr_assert_leq(xml_size(xml, "<system type=\"current\""), st.mapped_bytes);
    free(xml);
    free(big);
    errno = 0;
    cr_assert_eq(malloc_info(1, stderr), EINVAL);
    cr_assert_eq(errno, 0);
}

static void print_stats_with_live_blocks(void *arg)
{
    (void)arg;
    static void *p[5000];
    for (int i = 0; i < 5000; i++)
        p[i] = malloc(100);
    malloc_stats();
    for (int i = 0; i < 5000; i++)
        free(p[i]);
}

Test(malloc, malloc_stats_prints_graceslabs_summary)
{
    struct gst_child c;
    cr_assert(gst_run_child(print_stats_with_live_blocks, NULL, &c));
    cr_assert(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
    cr_assert(strncmp(c.err, "graceslab stats: mapped ", 24) == 0, "malloc_stats wrote: %s", c.err);
    const char *line = strstr(c.err, "class 112 B: live ");
    cr_assert_not_null(line, "no line for the 112 B class: %s", c.err);
    cr_assert_geq(strtoul(line + 18, NULL, 10), 5000, "the 5000 live 100 B blocks: %s", line);
}

static size_t count_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert_not_null(f);
    size_t n = 0;
    int c;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/* Blocks of 33..256 KiB come from slabs (the medium classes), many to a
   mapping. Each used to be a mapping of its own: 100,000 live 40 KB blocks
   ran into the kernel's limit of 65,530 mappings (allocating them took
   14.6 s, freeing them 15.3 s). Here 3,000 live blocks, their contents
   checked, must add fewer than 300 mappings (3,000 before). */
Test(malloc, medium_blocks_share_mappings)
{
    enum { N = 3000 };
    static unsigned char *p[N];
    static size_t size[N];
    uint64_t rng = 99;
    size_t maps0 = count_mappings();
    for (int i = 0; i < N; i++) {
        size[i] = (33 << 10) + gst_rand(&rng) % (223 << 10);
        p[i] = malloc(size[i]);
        cr_assert_not_null(p[i]);
        cr_assert_eq((uintptr_t)p[i] % 16, 0);
        cr_assert_geq(malloc_usable_size(p[i]), size[i]);
        cr_assert_leq(malloc_usable_size(p[i]) - size[i], size[i] / 8, "size %zu: usable %zu",
                      size[i], malloc_usable_size(p[i]));
        gst_fill(p[i], 64, (uintptr_t)i);
        gst_fill(p[i] + size[i] - 64, 64, (uintptr_t)i + N);
    }
    size_t maps = count_mappings();
    cr_assert_lt(maps, maps0 + 300, "%zu mappings for %d medium blocks (%zu before)", maps, N,
                 maps0);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(gst_check(p[i], 64, (uintptr_t)i), 64, "block %d overwritten", i);
        cr_assert_eq(gst_check(p[i] + size[i] - 64, 64, (uintptr_t)i + N), 64,
                     "block %d tail overwritten", i);
        free(p[i]);
    }
}

/* Alignments above a page up to a slot (64 KiB) come from slab classes
   too: 3000 live blocks, each of any size up to 64 KiB aligned to 8..64
   KiB, must not take a mapping each (as large blocks they did: a 4 MiB
   mapping for a 100-byte block, and 90 us per free). */
Test(malloc, aligned_blocks_share_mappings)
{
    enum { N = 3000 };
    static unsigned char *p[N];
    static size_t size[N];
    uint64_t rng = 7;
    size_t maps0 = count_mappings();
    for (int i = 0; i < N; i++) {
        size_t align = (size_t)8192 << (i % 4);
        size[i] = 1 + gst_rand(&rng) % (64 << 10);
        void *q = (void *)0x1;
        if (i % 2)
            cr_assert_eq(posix_memalign(&q, align, size[i]), 0);
        else
            q = aligned_alloc(align, size[i]);
        p[i] = q;
        cr_assert_not_null(p[i]);
        cr_assert_eq((uintptr_t)p[i] % align, 0, "%p not aligned to %zu", q, align);
        cr_assert_geq(malloc_usable_size(p[i]), size[i]);
        gst_fill(p[i], size[i] < 64 ? size[i] : 64, (uintptr_t)i);
    }
    size_t maps = count_mappings();
    cr_assert_lt(maps, maps0 + 300, "%zu mappings for %d aligned blocks (%zu before)", maps, N,
                 maps0);
    for (int i = 0; i < N; i++) {
        size_t n = size[i] < 64 ? size[i] : 64;
        cr_assert_eq(gst_check(p[i], n, (uintptr_t)i), n, "block %d overwritten", i);
        free(p[i]);
    }
}
