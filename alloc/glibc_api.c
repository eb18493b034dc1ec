/*
 * glibc's malloc extensions, graceslab's own: malloc_trim, mallinfo2,
 * mallinfo, malloc_stats and malloc_info trim and describe graceslab's
 * memory (glibc's would describe its unused arena: zeros, and nothing
 * given back); mallopt takes glibc's parameters and changes nothing
 * (graceslab's options are GRACESLAB_* variables). Every one is defined so
 * that a fully static program calling it links: libc.a defines them all in
 * one object with its whole malloc (tests/unit/fully_static.c).
 */
#include "alloc/internal.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>

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
        bytes += gsi_heap_trim_orphans(h);
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

/* glibc's tuning parameters mean nothing to graceslab: accepted and
   ignored, with glibc's answer (1, except for a fast-bin limit outside
   0..80 * sizeof(size_t) / 4, which glibc 2.36 refuses), so that programs
   that check it see what they would see on glibc. */
GS_EXPORT int mallopt(int param, int value)
{
    if (param == M_MXFAST)
        return value >= 0 && (size_t)value <= 80 * sizeof(size_t) / 4;
    return 1;
}

/* glibc's XML, with the elements whose meaning graceslab's figures share
   (mallinfo2's, above): "rest" the free bytes of the small-block memory
   and the large-block cache, "mmap" the live large blocks, "system" the
   memory committed, "aspace" the address space mapped; "fast" is empty
   (graceslab has no fast bins). No <sizes> (glibc lists its free chunks by
   size; graceslab has none) and no "max" (graceslab keeps no peak).
   Options other than 0 return EINVAL, errno untouched, as glibc's do.
   Called by the program, never from inside graceslab, so stdio may
   allocate here. */
GS_EXPORT int malloc_info(int options, FILE *fp)
{
    if (options != 0)
        return EINVAL;
    struct gs_stats st;
    gs_stats_get(&st);
    struct mallinfo2 mi = mallinfo2();
    fprintf(fp,
            "<malloc version=\"1\">\n"
            "<heap nr=\"0\">\n<sizes>\n</sizes>\n"
            "<total type=\"fast\" count=\"0\" size=\"0\"/>\n"
            "<total type=\"rest\" count=\"0\" size=\"%zu\"/>\n"
            "<system type=\"current\" size=\"%zu\"/>\n"
            "<aspace type=\"total\" size=\"%zu\"/>\n"
            "<aspace type=\"mprotect\" size=\"%zu\"/>\n"
            "</heap>\n"
            "<total type=\"fast\" count=\"0\" size=\"0\"/>\n"
            "<total type=\"rest\" count=\"0\" size=\"%zu\"/>\n"
            "<total type=\"mmap\" count=\"0\" size=\"%zu\"/>\n"
            "<system type=\"current\" size=\"%zu\"/>\n"
            "<aspace type=\"total\" size=\"%zu\"/>\n"
            "<aspace type=\"mprotect\" size=\"%zu\"/>\n"
            "</malloc>\n",
            mi.fordblks, st.committed_bytes, st.mapped_bytes, st.mapped_bytes, mi.fordblks,
            mi.hblkhd, st.committed_bytes, st.mapped_bytes, st.mapped_bytes);
    return 0;
}
