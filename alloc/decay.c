/*
 * Decay: the pages of medium objects (above 32 KiB) that stay free go back
 * to the OS.
 *
 * A freed medium object stays in its slab, and the slab goes back to its
 * segment only when all of its 4 to 8 objects are free. A program that
 * frees most of its medium blocks in a random order would keep nearly all
 * of their pages: 2000 blocks of 33..256 KiB, 283 MB when all were live,
 * 75 % freed, 288 MB still resident (jemalloc 289 MB until its decay
 * purges; as large blocks, before the medium classes, 75 MB).
 *
 * The owner does it, from its allocation slow path, at most once per
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
 */
#include "alloc/internal.h"

static void decay_slab(struct gs_slab *s, uint32_t pass)
{
    uint32_t now_free = 0;
    uint32_t steps = 0;
    for (uint64_t i = s->free_head; i != GS_LINK_END && steps++ < s->capacity;
         i = gsi_link_load(s, i))
        now_free |= (uint32_t)1 << i;
    /* Free at this pass and at the one before (not at some earlier one: a
       slab that was full, or another heap's, in between was not looked at). */
    uint32_t idle = s->idle_pass == pass - 1 ? now_free & s->idle_free : 0;
    s->idle_free = (uint16_t)now_free;
    s->idle_pass = pass;
    while (idle) {
        unsigned first = (unsigned)__builtin_ctz(idle), n = 0;
        while (first + n < 32 && (idle >> (first + n) & 1))
            n++;
        gsi_os_decommit(s->start + (size_t)first * s->obj_size, (size_t)n * s->obj_size);
        idle &= ~(uint32_t)(((uint64_t)1 << (first + n)) - ((uint64_t)1 << first));
    }
}

void gsi_heap_decay(struct gs_heap *h, unsigned cls)
{
    /* Under memcheck freed blocks stay as memcheck describes them. */
    if (gsi_valgrind)
        return;
    /* A heap that never had a medium slab never reads the clock. */
    if (!h->decay_ns && cls < GS_FIRST_MEDIUM_CLASS)
        return;
    uint64_t now = gsi_now_ns();
    if (h->decay_ns && now - h->decay_ns < (uint64_t)gsi_option(GSI_OPT_DECAY_MS) * 1000000u)
        return;
    h->decay_ns = now;
    /* A slab never looked at has idle_pass 0 and idle_free 0: at pass 1 it
       matches, with nothing idle. */
    uint32_t pass = ++h->decay_pass;
    for (unsigned c = GS_FIRST_MEDIUM_CLASS; c < GS_NCLASSES; c++) {
        if (h->active[c] != &gsi_empty_slab)
            decay_slab(h->active[c], pass);
        for (struct gs_slab *s = h->partial[c].first; s; s = s->next)
            decay_slab(s, pass);
        /* Waiting slabs (their pending objects wait for a grace period) may
           have free objects on their local list too. */
        for (struct gs_slab *s = h->waiting[c].first; s; s = s->next)
            decay_slab(s, pass);
    }
}
