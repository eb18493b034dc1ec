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
