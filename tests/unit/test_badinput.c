/*
 * Bad input (alloc/malloc.c, slab.c, large.c, fatal.c): every misuse runs
 * in a forked child whose stderr goes to a pipe. The child must die by
 * SIGABRT after writing exactly one line that starts with
 * "graceslab: <call>(): " and names the pointer in 0x hex.
 * Linked with libgraceslab.so like a program.
 */
#include <criterion/criterion.h>

#include "graceslab.h"
#include "../common.h"

#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#pragma GCC diagnostic ignored "-Wfree-nonheap-object"
#ifndef __clang__
#pragma GCC diagnostic ignored "-Wuse-after-free"
#pragma GCC diagnostic ignored "-Wmismatched-dealloc"
#endif

/* Each child reports the pointer it misuses before the fatal call. */
static void *misused(void *p)
{
    gst_child_report_ptr(p);
    return p;
}

static void expect_abort(void (*fn)(void *), const char *call)
{
    gst_assert_child_fatal(fn, call, NULL);
}

/* ---------------------------------------------------------- double free */

static void double_free_small(void *arg)
{
    (void)arg;
    void *keep = malloc(64);
    void *p = misused(malloc(64));
    free(p);
    free(p);
    free(keep);
}

static void double_free_small_alone(void *arg)
{
    (void)arg;
    /* The only object of its slab class: the first free may retire the
       slab. */
    void *p = misused(malloc(20000));
    free(p);
    free(p);
}

static void double_free_large(void *arg)
{
    (void)arg;
    void *p = misused(malloc(1 << 20));
    free(p);
    free(p);
}

static void double_free_huge(void *arg)
{
    (void)arg;
    void *p = misused(malloc(100 << 20)); /* unmapped at the first free */
    free(p);
    free(p);
}

static void double_free_large_aligned(void *arg)
{
    (void)arg;
    void *p = misused(aligned_alloc(1 << 16, 1 << 20));
    free(p);
    free(p);
}

static void double_free_small_aligned(void *arg)
{
    (void)arg;
    void *keep = aligned_alloc(256, 300);
    void *p = misused(aligned_alloc(256, 300));
    free(p);
    free(p);
    free(keep);
}

static void *free_it(void *p)
{
    free(p);
    return NULL;
}

static void double_free_cross_thread(void *arg)
{
    (void)arg;
    void *keep = malloc(128);
    void *p = misused(malloc(128));
    free(p);
    pthread_t t;
    pthread_create(&t, NULL, free_it, p); /* remote path */
    pthread_join(t, NULL);
    free(keep);
}

/* Both frees in another thread: the first one waits in that thread's
   batch of remote frees (not yet on the slab's chain) when the second
   comes. */
static void *free_twice(void *p)
{
    free(p);
    free(p);
    return NULL;
}

static void double_free_batched_remote(void *arg)
{
    (void)arg;
    void *keep = malloc(128);
    void *p = misused(malloc(128));
    pthread_t t;
    pthread_create(&t, NULL, free_twice, p);
    pthread_join(t, NULL);
    free(keep);
}

Test(badinput, double_free_batched_remote) { expect_abort(double_free_batched_remote, "free"); }
Test(badinput, double_free_small) { expect_abort(double_free_small, "free"); }
Test(badinput, double_free_small_alone) { expect_abort(double_free_small_alone, "free"); }
Test(badinput, double_free_small_aligned) { expect_abort(double_free_small_aligned, "free"); }
Test(badinput, double_free_cross_thread) { expect_abort(double_free_cross_thread, "free"); }
Test(badinput, double_free_large) { expect_abort(double_free_large, "free"); }
Test(badinput, double_free_large_aligned) { expect_abort(double_free_large_aligned, "free"); }
Test(badinput, double_free_huge) { expect_abort(double_free_huge, "free"); }

/* The message says what happened for a plain double free. */
Test(badinput, double_free_message)
{
    struct gst_child c;
    cr_assert(gst_run_child(double_free_small, NULL, &c));
    cr_assert(strstr(c.err, "double free") != NULL, "\"%s\"", c.err);
    cr_assert(gst_run_child(double_free_large, NULL, &c));
    cr_assert(strstr(c.err, "double free") != NULL, "\"%s\"", c.err);
}

/* ------------------------------------------------------- foreign pointers */

static char static_array[256];

static void free_stack(void *arg)
{
    (void)arg;
    char local[64];
    free(misused(local));
}

static void free_static(void *arg)
{
    (void)arg;
    free(misused(static_array + 16));
}

static void free_mmap(void *arg)
{
    (void)arg;
    void *m = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    free(misused(m));
}

static void free_mmap_aligned(void *arg)
{
    (void)arg;
    /* A foreign mapping on a 4 MiB boundary, like a segment would be. */
    char *m = mmap(NULL, 8 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *a = (char *)(((uintptr_t)m + (4 << 20) - 1) & ~(uintptr_t)((4 << 20) - 1));
    free(misused(a + 4096));
}

static void free_interior_small(void *arg)
{
    (void)arg;
    char *p = malloc(64);
    free(misused(p + 16));
}

static void free_interior_small_odd(void *arg)
{
    (void)arg;
    char *p = malloc(1000);
    free(misused(p + 1));
}

static void free_interior_large(void *arg)
{
    (void)arg;
    char *p = malloc(1 << 20);
    free(misused(p + 4096));
}

static void free_interior_large_far(void *arg)
{
    (void)arg;
    char *p = malloc(20 << 20);
    free(misused(p + (9 << 20) + 48));
}

/* The same address bits as a live block, with bit 47 set: not a
   user-space address, but the segment map (indexed by bits 22..46) sees
   the live block's segment. */
static void *noncanonical(void *p)
{
    return (void *)((uintptr_t)p | ((uintptr_t)1 << 47));
}

static void free_noncanonical_small(void *arg)
{
    (void)arg;
    free(misused(noncanonical(malloc(64))));
}

static void free_noncanonical_large(void *arg)
{
    (void)arg;
    free(misused(noncanonical(malloc(1 << 20))));
}

static void realloc_noncanonical_small(void *arg)
{
    (void)arg;
    free(realloc(misused(noncanonical(malloc(64))), 100));
}

/* The start of the 64 KiB slot of a small block: inside a slab, before
   its first object (the out-of-band links live there). */
static void free_slab_front(void *arg)
{
    (void)arg;
    char *p = malloc(64);
    free(misused((void *)((uintptr_t)p & ~(uintptr_t)0xFFFF)));
}

Test(badinput, free_noncanonical_small) { expect_abort(free_noncanonical_small, "free"); }
Test(badinput, free_noncanonical_large) { expect_abort(free_noncanonical_large, "free"); }
Test(badinput, realloc_noncanonical_small) { expect_abort(realloc_noncanonical_small, "realloc"); }
Test(badinput, free_slab_front) { expect_abort(free_slab_front, "free"); }
Test(badinput, free_stack_pointer) { expect_abort(free_stack, "free"); }
Test(badinput, free_static_array) { expect_abort(free_static, "free"); }
Test(badinput, free_mmap_pointer) { expect_abort(free_mmap, "free"); }
Test(badinput, free_mmap_aligned_pointer) { expect_abort(free_mmap_aligned, "free"); }
Test(badinput, free_interior_small) { expect_abort(free_interior_small, "free"); }
Test(badinput, free_interior_small_odd) { expect_abort(free_interior_small_odd, "free"); }
Test(badinput, free_interior_large) { expect_abort(free_interior_large, "free"); }
Test(badinput, free_interior_large_far) { expect_abort(free_interior_large_far, "free"); }

/* ---------------------------------------------------------------- realloc */

/* realloc(p, size) of a freed small block (size 0: realloc frees it). */
static void realloc_freed_small_to(size_t size)
{
    void *keep = malloc(64);
    void *p = misused(malloc(64));
    free(p);
    p = realloc(p, size);
    free(keep);
}

static void realloc_freed_small(void *arg)
{
    (void)arg;
    realloc_freed_small_to(200);
}

static void realloc_freed_large(void *arg)
{
    (void)arg;
    void *p = misused(malloc(1 << 20));
    free(p);
    p = realloc(p, 2 << 20);
}

static void realloc_foreign(void *arg)
{
    (void)arg;
    char local[64];
    void *p = realloc(misused(local), 100);
    (void)p;
}

static void realloc_interior(void *arg)
{
    (void)arg;
    char *p = malloc(256);
    void *q = realloc(misused(p + 32), 1000);
    (void)q;
}

static void realloc_zero_freed(void *arg)
{
    (void)arg;
    realloc_freed_small_to(0); /* realloc(p, 0) frees: a double free */
}

Test(badinput, realloc_freed_small) { expect_abort(realloc_freed_small, "realloc"); }
Test(badinput, realloc_freed_large) { expect_abort(realloc_freed_large, "realloc"); }
Test(badinput, realloc_foreign) { expect_abort(realloc_foreign, "realloc"); }
Test(badinput, realloc_interior) { expect_abort(realloc_interior, "realloc"); }
Test(badinput, realloc_zero_of_freed) { expect_abort(realloc_zero_freed, "realloc"); }

/* ------------------------------------------------------------ usable size */

static void usable_size_foreign(void *arg)
{
    (void)arg;
    char local[16];
    size_t n = malloc_usable_size(misused(local));
    (void)n;
}

Test(badinput, usable_size_foreign) { expect_abort(usable_size_foreign, "malloc_usable_size"); }

/* ------------------------------------------------------- good input lives */

static void good_input(void *arg)
{
    (void)arg;
    free(NULL);
    void *p = realloc(NULL, 10);
    p = realloc(p, 0);
    free(p);
    free_it(malloc(1 << 20));
}

Test(badinput, valid_calls_do_not_abort)
{
    struct gst_child c;
    cr_assert(gst_run_child(good_input, NULL, &c));
    cr_assert(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0, "status %#x: %s", c.status,
              c.err);
    cr_assert_eq(c.err_len, 0, "unexpected stderr: %s", c.err);
}
