/*
 * glibc's malloc extensions that programs call on whatever malloc they
 * run on: malloc_trim, mallinfo2, mallinfo, malloc_stats. Without these,
 * the calls would reach glibc's own (which describe and trim glibc's
 * unused arena: zeros, and nothing given back). mallopt and malloc_info
 * stay glibc's: graceslab has no equivalent of glibc's tuning parameters,
 * and malloc_info writes through stdio.
 */
#include "alloc/internal.h"

#include <limits.h>
#include <malloc.h>

/* From the static archive this object must bring the allocator it
   describes: a program that calls malloc_trim or mallinfo2 but never
   malloc itself (C++ that allocates with new only: libstdc++ calls malloc)
   would otherwise link graceslab's malloc_trim and mallinfo2 over glibc's
   malloc, and trim and describe an allocator that holds nothing. */
__attribute__((used)) static void *(*const pull_malloc_o)(size_t) = gs_malloc;

/* Gives back what graceslab keeps for reuse: the calling thread's empty
   slabs and the pages of its free medium objects (other threads' stay
   theirs: only an owner touches its lists), the committed empty slabs of
   every segment, and the large-block cache.
   Pending (gs_free_rcu) objects are not waited for: no grace period here.
   `pad` (glibc's top-of-heap slack) has no counterpart. Returns 1 if any
   memory went back to the OS, as glibc does. */
GS_EXPORT int malloc_trim(size_t pad)
{
    (void)pad;
    size_t bytes = 0;
    gsi_heap_init_once();
    struct gs_heap *h = gsi_tls_mine;
    if (h != &gsi_empty_heap) {
        gsi_remote_flush(h);
        gsi_heap_trim(h); /* into the segments, decommitted just below */
        bytes += gsi_heap_decay_now(h);
    }
    bytes += gsi_segments_purge(true);
    bytes += gsi_large_trim(true);
    return bytes > 0;
}

/* glibc's fields, in graceslab's terms: "arena" is memory committed for
   small blocks, "hblkhd" the live large (mmap'd) blocks, "uordblks" the
   small blocks in use, "fordblks" the rest of the arena plus cached large
   blocks. Counts of chunks (ordblks, smblks, hblks) have no counterpart
   and are 0, as are glibc's always-zero usmblks and keepcost. */
GS_EXPORT struct mallinfo2 mallinfo2(void)
{
    struct gs_stats st;
    gs_stats_get(&st);
    struct mallinfo2 mi = {0};
    size_t small_in_use = st.allocated_bytes - st.large_bytes;
    size_t cached = gsi_large_cached_bytes();
    /* committed_bytes counts every mapping: live and cached large blocks
       are taken out so that the cache is counted once, in fordblks. */
    size_t large = st.large_bytes + cached;
    mi.arena = st.committed_bytes > large ? st.committed_bytes - large : 0;
    if (mi.arena < small_in_use)
        mi.arena = small_in_use; /* racing threads: keep the sum consistent */
    mi.uordblks = small_in_use;
    mi.fordblks = mi.arena - small_in_use + cached;
    mi.hblkhd = st.large_bytes;
    return mi;
}

static int clamp_int(size_t v)
{
    return v > INT_MAX ? INT_MAX : (int)v;
}

/* The old interface: int fields, saturated (glibc wraps them). */
GS_EXPORT struct mallinfo mallinfo(void)
{
    struct mallinfo2 m2 = mallinfo2();
    struct mallinfo mi = {0};
    mi.arena = clamp_int(m2.arena);
    mi.uordblks = clamp_int(m2.uordblks);
    mi.fordblks = clamp_int(m2.fordblks);
    mi.hblkhd = clamp_int(m2.hblkhd);
    return mi;
}

GS_EXPORT struct mallinfo __libc_mallinfo(void) __attribute__((alias("mallinfo")));

/* glibc prints its arenas to stderr; graceslab prints the summary that
   GRACESLAB_STATS=1 prints at exit. */
GS_EXPORT void malloc_stats(void)
{
    gsi_stats_print();
}
