/*
 * The free fast path's fast map (alloc/segment.c, gsi_slab_hint): every
 * live segment whose entries no other live segment shares has them, and
 * they name the right slab; segments that share entries (addresses a
 * multiple of the map's span apart) have none, and their blocks still
 * free correctly through the slow path; unmapped segments leave no entry.
 * Linked with the static archive; built twice: with the real map (span
 * 64 GiB, so sharing does not happen here) and with GS_FASTMAP_BITS=8
 * (span 16 MiB: every fourth segment shares), test_fastmap_alias.
 */
#include <criterion/criterion.h>

#include "alloc/internal.h"
#include "../common.h"

#include <stdlib.h>

#define SPAN ((uintptr_t)1 << (GS_FASTMAP_BITS + GS_SLOT_SHIFT))
#define MAX_SEGS 4096

static struct gs_segment *segs[MAX_SEGS];

static struct gs_segment *segment_of(const void *p)
{
    return (struct gs_segment *)((uintptr_t)p & ~GS_SEGMENT_MASK);
}

static bool shares(const struct gs_segment *a, const struct gs_segment *b)
{
    return ((uintptr_t)a - (uintptr_t)b) % SPAN == 0;
}

static struct gs_slab *entry(const struct gs_segment *seg, unsigned slot)
{
    return gsi_slab_hint((const char *)seg + (size_t)slot * GS_SLOT_SIZE);
}

/* The invariant over all live segments; returns how many share entries. */
static size_t check_fastmap(void)
{
    size_t n = gsi_segments_list(segs, MAX_SEGS);
    cr_assert_leq(n, MAX_SEGS);
    size_t sharing = 0;
    for (size_t i = 0; i < n; i++) {
        bool alone = true;
        for (size_t j = 0; j < n; j++)
            if (j != i && shares(segs[i], segs[j]))
                alone = false;
        cr_assert_eq(segs[i]->fastmapped, alone,
                     "segment %p: fastmapped %d, but %s", (void *)segs[i],
                     segs[i]->fastmapped, alone ? "no other segment shares its entries"
                                                : "another segment shares its entries");
        if (!alone) {
            sharing++;
            /* Entries of shared slots belong to nobody. */
            for (unsigned s = 0; s < GS_SLOTS; s++)
                cr_assert_eq(entry(segs[i], s), &gsi_unused_slab);
            continue;
        }
        for (unsigned s = 0; s < GS_SLOTS; s++)
            cr_assert_eq(entry(segs[i], s), segs[i]->slot_slab[s],
                         "segment %p slot %u: entry not its slab", (void *)segs[i], s);
    }
    return sharing;
}

enum { N = 9000, SIZE = 16384 }; /* about 150 MiB: some 37 segments */
static void *blocks[N];

static void fill(size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        blocks[i] = malloc(SIZE);
        cr_assert_not_null(blocks[i]);
        memset(blocks[i], (int)(i & 0xff), SIZE);
    }
}

static void release(size_t from, size_t to, size_t step)
{
    for (size_t i = from; i < to; i += step) {
        cr_assert_eq(((unsigned char *)blocks[i])[SIZE - 1], (unsigned char)(i & 0xff));
        free(blocks[i]);
        blocks[i] = NULL;
    }
}

Test(fastmap, entries_name_the_slab_of_every_live_block)
{
    gsi_option_set(GSI_OPT_HEAP_EMPTY_KB, 0);
    fill(0, N);
    size_t sharing = check_fastmap();
    for (size_t i = 0; i < N; i++) {
        struct gs_segment *seg = segment_of(blocks[i]);
        if (seg->fastmapped)
            cr_assert_eq(gsi_slab_hint(blocks[i]), gsi_slab_of(blocks[i]));
        else
            cr_assert_neq(gsi_slab_hint(blocks[i]), gsi_slab_of(blocks[i]));
    }
#if GS_FASTMAP_BITS < 16
    /* 16 MiB span and some 37 segments: sharing must have happened, or
       this build tests nothing. */
    cr_assert_gt(sharing, 0, "no two segments share entries");
#else
    cr_assert_eq(sharing, 0, "segments 64 GiB apart in a 150 MiB heap");
#endif
    release(0, N, 1);
}

/* Segments come and go (every other block freed, then the rest, with forced
   purges that unmap empty segments, then refilled): the invariant holds at
   every step, blocks of segments without entries are freed correctly, and
   an unmapped segment leaves no entry behind unless a live one owns it. */
Test(fastmap, segments_join_and_leave)
{
    gsi_option_set(GSI_OPT_HEAP_EMPTY_KB, 0);
    for (int round = 0; round < 3; round++) {
        fill(0, N);
        check_fastmap();
        release(0, N, 2);
        gsi_segments_purge(true);
        check_fastmap();
        size_t before = gsi_segments_list(segs, MAX_SEGS);
        static struct gs_segment *old[MAX_SEGS];
        memcpy(old, segs, before * sizeof *old);
        release(1, N, 2);
        gsi_segments_purge(true);
        check_fastmap();
        size_t after = gsi_segments_list(segs, MAX_SEGS);
        cr_assert_lt(after, before, "no segment was unmapped");
        for (size_t i = 0; i < before; i++) {
            bool live = false, owned = false;
            for (size_t j = 0; j < after; j++) {
                live |= segs[j] == old[i];
                owned |= shares(segs[j], old[i]) && segs[j]->fastmapped;
            }
            if (live || owned)
                continue;
            for (unsigned s = 0; s < GS_SLOTS; s++)
                cr_assert_eq(entry(old[i], s), &gsi_unused_slab,
                             "unmapped segment %p slot %u still has an entry",
                             (void *)old[i], s);
        }
    }
}

/* A large block aligned to 64 KiB or more has its user pointer past its
   mapping's first slot, where a segment of the same class could own the
   entry (and be unmapped while the block is freed): while the block lives,
   no segment of its class owns entries, and its entry names the sentinel.
   When it goes, the invariant comes back. Also after realloc moves it. */
static struct gs_segment *class_owner(const void *unit)
{
    size_t n = gsi_segments_list(segs, MAX_SEGS);
    for (size_t j = 0; j < n; j++)
        if (shares(segs[j], unit) && segs[j]->fastmapped)
            return segs[j];
    return NULL;
}

Test(fastmap, aligned_large_blocks_own_no_entry)
{
    gsi_option_set(GSI_OPT_HEAP_EMPTY_KB, 0);
    fill(0, 300); /* a few segments: classes with one segment each */
    check_fastmap();
    enum { K = 32 };
    void *big[K];
    size_t taken = 0; /* blocks that joined a class a segment owned */
    for (int i = 0; i < K; i++) {
        size_t align = (size_t)65536 << (i % 4);
        /* Above the slab classes: with up to 64 KiB alignment a smaller
           block is a slab object. */
        cr_assert_eq(posix_memalign(&big[i], align, GS_SMALL_MAX + 1 + (size_t)i * 4096), 0);
        if (i % 2) { /* grow it far: realloc moves it */
            void *q = realloc(big[i], (size_t)64 << 20);
            cr_assert_not_null(q);
            big[i] = q;
        }
        cr_assert_geq((uintptr_t)big[i] & GS_SEGMENT_MASK, GS_SLOT_SIZE);
        cr_assert_eq(gsi_slab_hint(big[i]), &gsi_unused_slab,
                     "large block %p: its entry names a slab", big[i]);
        cr_assert_null(class_owner(segment_of(big[i])),
                       "a segment owns the entries of live large block %p", big[i]);
        size_t n = gsi_segments_list(segs, MAX_SEGS);
        for (size_t j = 0; j < n; j++)
            taken += shares(segs[j], segment_of(big[i]));
    }
#if GS_FASTMAP_BITS < 16
    cr_assert_gt(taken, 0, "no large block shares a class with a segment");
#else
    cr_log_info("large blocks sharing a class with a segment: %zu", taken);
#endif
    for (int i = 0; i < K; i++)
        free(big[i]);
    check_fastmap();
    release(0, 300, 1);
}

/* An address a multiple of the span away from a live block reads the
   block's own entry: free must not free the block it aliases. The exact
   index fails, and the slow path reports the pointer as foreign. */
static void free_alias(void *arg)
{
    (void)arg;
    /* A block of a segment with entries of its own: in the alias build a
       segment shares them with any other 16 MiB away, as the runner's two
       may be; new ones come next to them. */
    char *p = NULL;
    for (int i = 0; i < 1024 && !p; i++) {
        char *b = malloc(GS_DIRECT_MAX); /* 10 a slab of 5 slots */
        if (gsi_slab_hint(b) == gsi_slab_of(b))
            p = b;
    }
    if (!p)
        gst_child_fail("no block in a segment with entries of its own (%zu segments)", gsi_segments_count());
    char *q = NULL;
    for (uintptr_t k = 1; k < 4096 && !q; k++)
        if (gsi_map_kind((uintptr_t)p - k * SPAN) == 0)
            q = p - k * SPAN; /* foreign memory (normally not even mapped) */
    if (!q || gsi_slab_hint(q) != gsi_slab_hint(p) || gsi_slab_hint(p) != gsi_slab_of(p))
        gst_child_fail("no foreign alias of %p that reads its entry", (void *)p);
    gst_child_report_ptr(q);
    free(q);
    gst_child_fail("free(%p) returned", (void *)q);
}

Test(fastmap, aliased_foreign_pointer_rejected)
{
    gst_assert_child_fatal(free_alias, "free", "not allocated by graceslab");
}
