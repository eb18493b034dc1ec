/*
 * Decay: the pages of medium objects (above 32 KiB) that stay free go back
 * to the OS, and so do the empty slabs a heap keeps that stay unused
 * (heap.c, gsi_heap_retire_idle_kept).
 *
 * A freed medium object stays in its slab, and the slab goes back to its
 * segment only when all of its 4 to 16 objects are free. A program that
 * frees most of its medium blocks in a random order would keep nearly all
 * of their pages: 2000 blocks of 33..256 KiB, 283 MB when all were live,
 * 75 % freed, 288 MB still resident (jemalloc 289 MB until its decay
 * purges; as large blocks, before the medium classes, 75 MB).
 *
 * The owner does it, from its allocation slow path and when a free
 * empties one of its slabs, at most once per
 * GRACESLAB_DECAY_MS: an object found on its slab's local free list at two
 * passes in a row (of its heap, the slab looked at in both) has its pages
 * decommitted (madvise; it is handed out
 * again as zero pages, faulted in on use). Only the owner pops or pushes
 * the local list, so nothing on it can be handed out during the pass;
 * objects waiting for a grace period (pending chains, which readers may
 * still read) and objects freed by other threads (the remote chain) are not
 * on it. An object reused and freed again between two passes counts as
 * idle: it is decommitted and faults in again, at most once a pass (so
 * may one of a slab adopted from another heap whose pass numbers matched).
 * Medium objects are whole pages, page-aligned (size_class.c), so the
 * link array and the neighbours are never touched.
 *
 * malloc_trim gives back every free object of the calling heap's lists at
 * once (gsi_heap_decay_now), idle or not; an owner that gives up a slab
 * with free objects gives theirs back past the orphans' budget (heap.c,
 * orphan_keep).
 */
#include "alloc/internal.h"

/* Relaxed: a statistic; each slab's part is its owner's (decayed). The
   count goes up before a slab's bits are set and down after they are
   cleared, so that a fork child, which may find a thread of the parent
   between the two, can only see it too high (committed_bytes then reads
   low by at most that thread's slab, clamped at 0 in stats.c): signed,
   since a child's later clears could otherwise take it below zero. */
_Atomic int64_t gsi_decayed_bytes;

void gsi_decay_reused(struct gs_slab *s, uint64_t idx)
{
    uint16_t bit = (uint16_t)(1u << idx);
    if (s->decayed & bit) {
        s->decayed &= (uint16_t)~bit;
        atomic_fetch_sub_explicit(&gsi_decayed_bytes, (int64_t)s->obj_size, memory_order_relaxed);
    }
}

void gsi_decay_forget(struct gs_slab *s)
{
    if (s->decayed) {
        atomic_fetch_sub_explicit(&gsi_decayed_bytes,
                                  (int64_t)__builtin_popcount(s->decayed) * (int64_t)s->obj_size,
                                  memory_order_relaxed);
        s->decayed = 0;
    }
}

/* The objects on s's local free list, one bit each (medium slabs hold at
   most 16). */
static uint32_t local_free_mask(struct gs_slab *s)
{
    uint32_t mask = 0;
    uint32_t steps = 0;
    for (uint64_t i = s->free_head; i != GS_LINK_END && steps++ < s->capacity;
         i = gsi_link_load(s, i))
        mask |= (uint32_t)1 << i;
    return mask;
}

/* Decommits the objects in mask, a run of neighbours at a time, and marks
   them decayed; returns the bytes newly given back (objects decayed
   already count once). A run whose madvise fails (locked pages) stays
   committed, unmarked. */
static size_t decommit_objects(struct gs_slab *s, uint32_t mask)
{
    uint32_t fresh = mask & ~(uint32_t)s->decayed;
    size_t bytes = (size_t)__builtin_popcount(fresh) * s->obj_size;
    atomic_fetch_add_explicit(&gsi_decayed_bytes, (int64_t)bytes, memory_order_relaxed);
    while (mask) {
        unsigned first = (unsigned)__builtin_ctz(mask), n = 0;
        while (first + n < 32 && (mask >> (first + n) & 1))
            n++;
        uint32_t run = (uint32_t)(((uint64_t)1 << (first + n)) - ((uint64_t)1 << first));
        if (gsi_os_decommit(s->start + (size_t)first * s->obj_size, (size_t)n * s->obj_size)) {
            s->decayed |= (uint16_t)run;
        } else {
            size_t lost = (size_t)__builtin_popcount(run & fresh) * s->obj_size;
            atomic_fetch_sub_explicit(&gsi_decayed_bytes, (int64_t)lost, memory_order_relaxed);
            bytes -= lost;
        }
        mask &= ~run;
    }
    return bytes;
}

static size_t decay_slab(struct gs_slab *s, uint32_t pass)
{
    uint32_t now_free = local_free_mask(s);
    /* Free at this pass and at the one before (not at some earlier one: a
       slab that was full, or another heap's, in between was not looked at). */
    uint32_t idle = s->idle_pass == pass - 1 ? now_free & s->idle_free : 0;
    s->idle_free = (uint16_t)now_free;
    s->idle_pass = pass;
    /* Decayed ones have nothing left to give back. */
    return decommit_objects(s, idle & ~(uint32_t)s->decayed);
}

/* malloc_trim's visit: every free object, idle or not, that still has
   resident pages, so that malloc_trim returns 1 only when memory went back
   (graceslab's rule since before decay: a second trim returns 0; glibc
   2.36 returns 1 on every trim). An object whose pages are all in swap is
   left as it is. */
static size_t decay_slab_now(struct gs_slab *s, uint32_t pass)
{
    (void)pass;
    uint32_t mask = 0;
    for (uint32_t m = local_free_mask(s); m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctz(m);
        /* unknown: counted, as a decommit would be tried */
        if (gsi_os_resident_bytes(s->start + (size_t)i * s->obj_size, s->obj_size, true))
            mask |= (uint32_t)1 << i;
    }
    /* Decayed ones too, if resident again (khugepaged may fill a range
       back in): given back again, but counted as decayed once. */
    uint32_t again = mask & s->decayed;
    return decommit_objects(s, mask) + (size_t)__builtin_popcount(again) * s->obj_size;
}

/* Orphans (heap.c, "orphans"): the owner of a medium slab it is about to
   give up finds the free objects that still have their pages, and gives
   them back if the orphans' budget has no room for them. Not those never
   handed out on slots without old bytes (zero_from): they have no pages
   yet (a slab of 14 objects of 40 KiB whose thread used 8 counted 6 more). */
uint32_t gsi_slab_committed_free(struct gs_slab *s)
{
    if (gsi_valgrind || s->cls < GS_FIRST_MEDIUM_CLASS)
        return 0;
    uint32_t never_used = ((uint32_t)1 << s->capacity) - ((uint32_t)1 << s->zero_from);
    return local_free_mask(s) & ~(uint32_t)s->decayed & ~never_used;
}

void gsi_slab_decommit_free(struct gs_slab *s, uint32_t mask)
{
    decommit_objects(s, mask);
}

/* Visits every medium slab of h that may have objects on its local free
   list: active, partial, kept, and waiting (whose pending objects wait for a
   grace period, and which may have free ones too). Returns the bytes
   decommitted. */
static size_t visit_medium_slabs(struct gs_heap *h, size_t (*visit)(struct gs_slab *, uint32_t),
                                 uint32_t pass)
{
    size_t bytes = 0;
    for (unsigned c = GS_FIRST_MEDIUM_CLASS; c < GS_NCLASSES; c++) {
        if (h->active[c] != &gsi_empty_slab)
            bytes += visit(h->active[c], pass);
        for (struct gs_slab *s = h->partial[c].first; s; s = s->next)
            bytes += visit(s, pass);
        for (struct gs_slab *s = h->kept[c].first; s; s = s->next)
            bytes += visit(s, pass);
        for (struct gs_slab *s = h->waiting[c].first; s; s = s->next)
            bytes += visit(s, pass);
    }
    return bytes;
}

/* Read on every slow path of a heap with medium or kept slabs (half the
   operations when 1000 medium blocks are replaced in turn): the coarse
   clock, unless the period is short enough for its tick to matter. */
static uint64_t decay_clock(uint64_t period)
{
    return period >= 100000000u ? gsi_now_coarse_ns() : gsi_now_ns();
}

void gsi_heap_decay_start(struct gs_heap *h)
{
    if (!h->decay_ns)
        h->decay_ns = decay_clock((uint64_t)gsi_option(GSI_OPT_DECAY_MS) * 1000000u);
}

void gsi_heap_decay(struct gs_heap *h, unsigned cls)
{
    /* Under memcheck freed blocks stay as memcheck describes them. */
    if (gsi_valgrind)
        return;
    /* A heap that never had a medium slab nor kept an empty one never
       reads the clock. */
    if (!h->decay_ns && cls < GS_FIRST_MEDIUM_CLASS)
        return;
    uint64_t period = (uint64_t)gsi_option(GSI_OPT_DECAY_MS) * 1000000u;
    uint64_t now = decay_clock(period);
    /* Signed: the coarse clock may read a little behind a stamp of the
       fine one (the period changed), which is no time elapsed. */
    if (h->decay_ns && (int64_t)(now - h->decay_ns) < (int64_t)period)
        return;
    h->decay_ns = now;
    /* A slab never looked at has idle_pass 0 and idle_free 0: at pass 1 it
       matches, with nothing idle. */
    visit_medium_slabs(h, decay_slab, ++h->decay_pass);
    gsi_heap_retire_idle_kept(h);
}

/* malloc_trim: every object on h's medium local free lists goes back now,
   idle or not (glibc's malloc_trim likewise gives back the free pages
   inside its heaps). Returns the bytes. */
size_t gsi_heap_decay_now(struct gs_heap *h)
{
    return gsi_valgrind ? 0 : visit_medium_slabs(h, decay_slab_now, 0);
}
