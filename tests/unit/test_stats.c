/*
 * Statistics (alloc/stats.c) through the public gs_stats_get(): live bytes
 * follow allocations and frees exactly, the class table is published, the
 * byte figures are consistent. Linked with libgraceslab.so.
 */
#include <criterion/criterion.h>

#include "graceslab.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static struct gs_stats st;

static unsigned class_of(const struct gs_stats *s, size_t usable)
{
    for (unsigned c = 0; c < s->nclasses; c++)
        if (s->class_size[c] == usable)
            return c;
    return ~0u;
}

Test(stats, class_table_published)
{
    gs_stats_get(&st);
    cr_assert_gt(st.nclasses, 0);
    cr_assert_leq(st.nclasses, GS_STATS_CLASSES);
    cr_assert_eq(st.class_size[0], 16);
    for (unsigned c = 1; c < st.nclasses; c++)
        cr_assert_gt(st.class_size[c], st.class_size[c - 1]);
}

Test(stats, allocated_follows_malloc_and_free)
{
    struct gs_stats a, b, c;
    gs_stats_get(&a);
    void *p = malloc(100);
    void *q = malloc(1 << 20);
    gs_stats_get(&b);
    size_t up = gs_usable_size(p), uq = gs_usable_size(q);
    cr_assert_eq(b.allocated_bytes - a.allocated_bytes, up + uq);
    cr_assert_eq(b.large_bytes - a.large_bytes, uq);
    unsigned k = class_of(&b, up);
    cr_assert_neq(k, ~0u, "usable size %zu is no class size", up);
    cr_assert_eq(b.class_allocated[k], a.class_allocated[k] + 1);
    free(p);
    free(q);
    gs_stats_get(&c);
    cr_assert_eq(c.allocated_bytes, a.allocated_bytes);
    cr_assert_eq(c.large_bytes, a.large_bytes);
    cr_assert_eq(c.class_allocated[k], a.class_allocated[k]);
}

Test(stats, byte_figures_consistent)
{
    void *p[1000];
    for (int i = 0; i < 1000; i++)
        p[i] = malloc((size_t)i * 40);
    gs_stats_get(&st);
    cr_assert_geq(st.mapped_bytes, st.committed_bytes);
    cr_assert_geq(st.committed_bytes, st.allocated_bytes - st.large_bytes);
    cr_assert_geq(st.segments, 1);
    cr_assert_geq(st.slabs, 1);
    size_t sum = st.large_bytes;
    for (unsigned c = 0; c < st.nclasses; c++)
        sum += st.class_allocated[c] * st.class_size[c];
    cr_assert_eq(sum, st.allocated_bytes);
    for (int i = 0; i < 1000; i++)
        free(p[i]);
}

static void *touch(void *arg)
{
    free(malloc(10));
    struct gs_stats *s = arg;
    gs_stats_get(s);
    return NULL;
}

/* "thread heaps, live or abandoned": two threads have made heaps. */
Test(stats, heaps_counted)
{
    struct gs_stats in_thread;
    free(malloc(10));
    pthread_t t;
    pthread_create(&t, NULL, touch, &in_thread);
    pthread_join(t, NULL);
    cr_assert_geq(in_thread.heaps, 2, "gs_stats.heaps = %zu with two threads allocating",
                  in_thread.heaps);
}

/* A large block resized by realloc counts its new usable size, grown or
   shrunk, in place or moved (the count kept the old size once, and free
   then took the new one off: the figures drifted and wrapped). */
Test(stats, large_realloc_counted_at_new_size)
{
    struct gs_stats a, b;
    gs_stats_get(&a);
    void *p = malloc(300000);
    size_t steps[] = {600000, 3 << 20, 400000, 300001};
    for (unsigned i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        void *q = realloc(p, steps[i]);
        cr_assert_not_null(q);
        p = q;
        gs_stats_get(&b);
        cr_assert_eq(b.large_bytes - a.large_bytes, gs_usable_size(p),
                     "after realloc to %zu: large_bytes grew by %zu, usable size %zu", steps[i],
                     b.large_bytes - a.large_bytes, gs_usable_size(p));
        cr_assert_eq(b.allocated_bytes - a.allocated_bytes, gs_usable_size(p));
    }
    free(p);
    gs_stats_get(&b);
    cr_assert_eq(b.large_bytes, a.large_bytes);
    cr_assert_eq(b.allocated_bytes, a.allocated_bytes);
}

enum { REMOTE_N = 500 };
static void *remote_objs[REMOTE_N];

static void *free_remote_objs(void *arg)
{
    (void)arg;
    for (int i = 0; i < REMOTE_N; i++)
        free(remote_objs[i]);
    return NULL; /* its exit pushes its last batch onto the slab */
}

/* Objects another thread freed are not allocated any more, even before
   their owner collects them from the slab's remote chain (they counted as
   allocated until the owner's next refill). */
Test(stats, remote_frees_not_counted_as_allocated)
{
    struct gs_stats a, b;
    free(malloc(100)); /* this thread's heap exists */
    gs_stats_get(&a);
    for (int i = 0; i < REMOTE_N; i++)
        remote_objs[i] = malloc(100);
    size_t usable = gs_usable_size(remote_objs[0]);
    unsigned k = class_of(&a, usable);
    cr_assert_neq(k, ~0u);
    gs_stats_get(&b);
    cr_assert_eq(b.class_allocated[k], a.class_allocated[k] + REMOTE_N);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, free_remote_objs, NULL), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    gs_stats_get(&b); /* no allocation in between: nothing collected */
    cr_assert_eq(b.class_allocated[k], a.class_allocated[k], "%zu objects of class %u, %zu before",
                 b.class_allocated[k], k, a.class_allocated[k]);
}
