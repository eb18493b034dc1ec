/*
 * Valgrind client requests: tell memcheck about graceslab's blocks so that
 * leaks, invalid reads and use after free inside graceslab heaps are
 * reported to users, and so that an object freed with gs_free_rcu() stays
 * addressable until its grace period ends and becomes no-access after.
 *
 * Zero cost outside Valgrind: when the process runs under Valgrind, the
 * thread's fast-path heap stays the empty heap (heap.c), so every malloc
 * and free takes the slow paths, where these requests are made; the fast
 * paths themselves have no test for it.
 */
#ifndef GS_VG_H
#define GS_VG_H

#include <stdbool.h>

extern bool gsi_valgrind; /* set once at initialisation */

#if GS_VALGRIND
#include <valgrind/memcheck.h>
#include <valgrind/valgrind.h>
/* Under memcheck only: other tools (callgrind, helgrind...) measure or
   check the program as it runs natively, fast paths included.
   VALGRIND_GET_VBITS is a memcheck request; other tools answer 0. */
static inline bool gs_vg_memcheck(void)
{
    static volatile char probe;
    char vbits = 0;
    return RUNNING_ON_VALGRIND && VALGRIND_GET_VBITS(&probe, &vbits, 1) == 1;
}
#define GS_VG_RUNNING() (gs_vg_memcheck())
/* vg_sizes.c: the client requests plus the size memcheck knows. */
void gsi_vg_alloc(void *p, size_t size, bool zeroed);
void gsi_vg_free(void *p);
void gsi_vg_resize(const void *p, size_t size);
#define GS_VG_ALLOC(p, n, zeroed)                                              \
    do {                                                                       \
        if (gsi_valgrind && (p))                                               \
            gsi_vg_alloc((p), (n), (zeroed));                                  \
    } while (0)
#define GS_VG_FREE(p)                                                          \
    do {                                                                       \
        if (gsi_valgrind)                                                      \
            gsi_vg_free(p);                                                    \
    } while (0)
/* The program may now use p's first n bytes (malloc_usable_size told it
   so, or realloc kept the block in place). */
#define GS_VG_RESIZE(p, n)                                                     \
    do {                                                                       \
        if (gsi_valgrind)                                                      \
            gsi_vg_resize((p), (n));                                           \
    } while (0)
#define GS_VG_NOACCESS(p, n)                                                   \
    do {                                                                       \
        if (gsi_valgrind)                                                      \
            VALGRIND_MAKE_MEM_NOACCESS((p), (n));                              \
    } while (0)
/* Memory that becomes graceslab metadata again (a slab's link array over
   slots that held objects before). */
#define GS_VG_ADDRESSABLE(p, n)                                                \
    do {                                                                       \
        if (gsi_valgrind)                                                      \
            VALGRIND_MAKE_MEM_UNDEFINED((p), (n));                             \
    } while (0)
/* A freed object of a GS_CACHE_TYPESAFE_BY_RCU cache: readers may still
   read it (it stays an object of the cache's type until the slab's grace
   period ends), so it stays readable, with its last contents. */
#define GS_VG_TYPESAFE(p, n)                                                   \
    do {                                                                       \
        if (gsi_valgrind)                                                      \
            VALGRIND_MAKE_MEM_DEFINED((p), (n));                               \
    } while (0)
/* graceslab's own reads of a block's slack (realloc copies the usable
   size, which memcheck does not know). */
#define GS_VG_QUIET_BEGIN()                                                    \
    do {                                                                       \
        if (gsi_valgrind)                                                      \
            VALGRIND_DISABLE_ERROR_REPORTING;                                  \
    } while (0)
#define GS_VG_QUIET_END()                                                      \
    do {                                                                       \
        if (gsi_valgrind)                                                      \
            VALGRIND_ENABLE_ERROR_REPORTING;                                   \
    } while (0)
#else
#define GS_VG_RUNNING() false
#define GS_VG_ALLOC(p, n, zeroed) ((void)(p), (void)(n), (void)(zeroed))
#define GS_VG_FREE(p) ((void)(p))
#define GS_VG_RESIZE(p, n) ((void)(p), (void)(n))
#define GS_VG_NOACCESS(p, n) ((void)(p), (void)(n))
#define GS_VG_ADDRESSABLE(p, n) ((void)(p), (void)(n))
#define GS_VG_TYPESAFE(p, n) ((void)(p), (void)(n))
#define GS_VG_QUIET_BEGIN() ((void)0)
#define GS_VG_QUIET_END() ((void)0)
#endif
/* vg_sizes.c's lock around fork (no-ops without Valgrind support). */
void gsi_vg_atfork_prepare(void);
void gsi_vg_atfork_parent(void);
void gsi_vg_atfork_child(void);

#endif /* GS_VG_H */
