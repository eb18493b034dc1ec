/*
 * A program linked statically with libgraceslab.a: malloc, and the
 * allocations libc makes for it (strdup, stdio buffers), are graceslab's.
 */
#include <criterion/criterion.h>

#include "alloc/internal.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef __clang__
#pragma GCC diagnostic ignored "-Walloc-size-larger-than="
#endif

Test(static_link, malloc_is_graceslab)
{
    struct gs_stats a, b;
    gs_stats_get(&a);
    void *p = malloc(100);
    gs_stats_get(&b);
    cr_assert_eq(gsi_map_kind((uintptr_t)p), GS_MAP_SMALL, "malloc(100) not from a segment");
    cr_assert_eq(b.allocated_bytes - a.allocated_bytes, gs_usable_size(p));
    cr_assert_eq(malloc_usable_size(p), 112, "100 B is in the 112 B class");
    free(p);
    void *l = malloc(1 << 20);
    cr_assert_geq(gsi_map_kind((uintptr_t)l), GS_MAP_LARGE);
    free(l);
}

/* libc's own allocations go through the same malloc. */
Test(static_link, libc_allocates_from_graceslab)
{
    char *s = strdup("graceslab");
    cr_assert_eq(gsi_map_kind((uintptr_t)s), GS_MAP_SMALL, "strdup not served by graceslab");
    cr_assert_str_eq(s, "graceslab");
    free(s);
    char *line = NULL;
    size_t cap = 0;
    FILE *f = fmemopen("one line\n", 9, "r");
    cr_assert_not_null(f);
    cr_assert_eq(getline(&line, &cap, f), 9);
    cr_assert_neq(gsi_map_kind((uintptr_t)line), 0, "getline buffer not from graceslab");
    cr_assert_str_eq(line, "one line\n");
    free(line);
    fclose(f);
}

Test(static_link, basic_behaviour)
{
    char *p = calloc(10, 10);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(p[i], 0);
    p = realloc(p, 10000);
    cr_assert_eq(p[99], 0);
    void *a = aligned_alloc(4096, 100);
    cr_assert_eq((uintptr_t)a % 4096, 0);
    cr_assert_eq(gsi_map_kind((uintptr_t)a), GS_MAP_SMALL);
    free(a);
    free(p);
    errno = 0;
    cr_assert_null(malloc(SIZE_MAX));
    cr_assert_eq(errno, ENOMEM);
}
