/*
 * Segments: 4 MiB, 4 MiB-aligned mappings cut into 64 KiB slots. Slot 0
 * holds the segment header with every slab's metadata, so p -> slab is two
 * masks and one load (gsi_slab_of). A slab takes 1..4 contiguous slots.
 *
 * Memory return: a retired (empty) slab stays committed ("dirty") for at
 * most GRACESLAB_PURGE_DELAY_MS, so a slab that empties and refills quickly
 * costs no page faults; but never more than GRACESLAB_EMPTY_CACHE_MB of
 * dirty slabs are kept, so freeing a large heap gives memory back at once,
 * with no timer. Segments left with no used slot are unmapped, keeping one
 * spare.
 *
 * Locking: segment_lock protects the segment list and every segment's
 * free_slots, dirty_slots, dirty_since and slot_slab; a slab's kind is
 * written under it. It is taken on slab creation and retirement only.
 */
#include "alloc/internal.h"

#include <string.h>

static pthread_mutex_t segment_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gs_segment *segment_list;
static size_t segment_count;
static size_t dirty_bytes;     /* committed bytes in unused slots (written under
                                  the lock with relaxed stores: also read as a hint) */
static uint64_t last_purge_ns; /* time of the last purge pass */

/* The metadata of every unused slot: kind UNUSED, so a free into it is
   reported, and an owner that never matches. */
static struct gs_slab unused_slab = {.kind = GS_SLAB_UNUSED};

#define ALL_SLABS (~(uint64_t)1) /* slots 1..63 */

void gsi_segments_lock(void) { pthread_mutex_lock(&segment_lock); }
void gsi_segments_unlock(void) { pthread_mutex_unlock(&segment_lock); }

void gsi_segments_atfork_child(void)
{
    pthread_mutex_init(&segment_lock, NULL);
}

static uint64_t run_mask(unsigned first, unsigned n)
{
    return (n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1)) << first;
}

/* First run of n set bits in avail, or -1. */
static int find_run(uint64_t avail, unsigned n)
{
    for (unsigned i = 1; i + n <= GS_SLOTS; i++)
        if ((avail & run_mask(i, n)) == run_mask(i, n))
            return (int)i;
    return -1;
}

static struct gs_segment *segment_new_locked(void)
{
    /* Map without the lock held would allow two threads to map at once;
       mapping is rare (one per 63 slabs) and the lock keeps it simple. */
    struct gs_segment *seg = gsi_os_map_aligned(GS_SEGMENT_SIZE, GS_SEGMENT_SIZE);
    if (!seg)
        return NULL;
    seg->magic = GS_SEGMENT_MAGIC;
    seg->free_slots = ALL_SLABS;
    seg->dirty_slots = 0;
    for (unsigned i = 0; i < GS_SLOTS; i++)
        seg->slot_slab[i] = &unused_slab;
    seg->next = segment_list;
    seg->prev = NULL;
    if (segment_list)
        segment_list->prev = seg;
    segment_list = seg;
    __atomic_store_n(&segment_count, segment_count + 1, __ATOMIC_RELAXED);
    gsi_map_set(seg, GS_SEGMENT_SIZE, GS_MAP_SMALL);
    return seg;
}

static void segment_free_locked(struct gs_segment *seg)
{
    if (seg->prev)
        seg->prev->next = seg->next;
    else
        segment_list = seg->next;
    if (seg->next)
        seg->next->prev = seg->prev;
    __atomic_store_n(&segment_count, segment_count - 1, __ATOMIC_RELAXED);
    gsi_map_clear(seg, GS_SEGMENT_SIZE);
    gsi_os_unmap(seg, GS_SEGMENT_SIZE);
}

static void decommit_locked(struct gs_segment *seg, uint64_t mask)
{
    seg->dirty_slots &= ~mask;
    /* madvise contiguous runs of the mask. */
    while (mask) {
        unsigned first = (unsigned)__builtin_ctzll(mask);
        unsigned n = 0;
        while (first + n < GS_SLOTS && (mask >> (first + n) & 1))
            n++;
        gsi_os_decommit((char *)seg + (size_t)first * GS_SLOT_SIZE, (size_t)n * GS_SLOT_SIZE);
        mask &= ~run_mask(first, n);
        __atomic_store_n(&dirty_bytes, dirty_bytes - (size_t)n * GS_SLOT_SIZE, __ATOMIC_RELAXED);
    }
}

static size_t purge_locked(bool force, uint64_t now)
{
    uint64_t delay = (uint64_t)gsi_option(GSI_OPT_PURGE_DELAY_MS) * 1000000ull;
    size_t before = dirty_bytes;
    bool spare = false;
    last_purge_ns = now;
    for (struct gs_segment *seg = segment_list, *next; seg; seg = next) {
        next = seg->next;
        uint64_t old = 0;
        for (uint64_t m = seg->dirty_slots; m; m &= m - 1) {
            unsigned i = (unsigned)__builtin_ctzll(m);
            if (force || now - seg->dirty_since[i] >= delay)
                old |= (uint64_t)1 << i;
        }
        if (old)
            decommit_locked(seg, old);
        if (seg->free_slots == ALL_SLABS && !seg->dirty_slots) {
            if (spare || force)
                segment_free_locked(seg);
            else
                spare = true;
        }
    }
    return before - dirty_bytes;
}

size_t gsi_segments_purge(bool force)
{
    uint64_t now = gsi_now_ns();
    pthread_mutex_lock(&segment_lock);
    size_t n = purge_locked(force, now);
    pthread_mutex_unlock(&segment_lock);
    return n;
}

struct gs_slab *gsi_slab_new(unsigned cls)
{
    unsigned span = gsi_classes[cls].span;
    pthread_mutex_lock(&segment_lock);
    struct gs_segment *found = NULL;
    int first = -1;
    /* Prefer committed (dirty) slots: no page faults, less RSS. */
    for (struct gs_segment *seg = segment_list; seg && first < 0; seg = seg->next) {
        if (seg->dirty_slots && (first = find_run(seg->dirty_slots, span)) >= 0)
            found = seg;
    }
    for (struct gs_segment *seg = segment_list; seg && first < 0; seg = seg->next) {
        if (seg->free_slots && (first = find_run(seg->free_slots, span)) >= 0)
            found = seg;
    }
    if (first < 0) {
        found = segment_new_locked();
        if (!found) {
            pthread_mutex_unlock(&segment_lock);
            return NULL;
        }
        first = 1;
    }
    uint64_t mask = run_mask((unsigned)first, span);
    size_t dirty = (size_t)__builtin_popcountll(found->dirty_slots & mask);
    __atomic_store_n(&dirty_bytes, dirty_bytes - dirty * GS_SLOT_SIZE, __ATOMIC_RELAXED);
    found->free_slots &= ~mask;
    found->dirty_slots &= ~mask;
    struct gs_slab *s = &found->slabs[first];
    gsi_slab_format(s, (char *)found + (size_t)first * GS_SLOT_SIZE, cls);
    s->kind = GS_SLAB_SMALL;
    for (unsigned i = 0; i < span; i++)
        found->slot_slab[first + i] = s;
    uint64_t now = 0;
    if (dirty_bytes && (now = gsi_now_ns()) - last_purge_ns >
                           (uint64_t)gsi_option(GSI_OPT_PURGE_DELAY_MS) * 1000000ull)
        purge_locked(false, now);
    pthread_mutex_unlock(&segment_lock);
    return s;
}

void gsi_slab_retire(struct gs_slab *s)
{
    struct gs_segment *seg = (struct gs_segment *)((uintptr_t)s & ~GS_SEGMENT_MASK);
    unsigned first = (unsigned)(s - seg->slabs);
    uint64_t mask = run_mask(first, s->span);
    uint64_t now = gsi_now_ns();
    pthread_mutex_lock(&segment_lock);
    GS_ASSERT(s->kind == GS_SLAB_SMALL);
    s->kind = GS_SLAB_UNUSED;
    for (unsigned i = 0; i < s->span; i++) {
        seg->slot_slab[first + i] = &unused_slab;
        seg->dirty_since[first + i] = now;
    }
    seg->free_slots |= mask;
    seg->dirty_slots |= mask;
    __atomic_store_n(&dirty_bytes, dirty_bytes + (size_t)s->span * GS_SLOT_SIZE, __ATOMIC_RELAXED);
    if (dirty_bytes > (size_t)gsi_option(GSI_OPT_EMPTY_CACHE_MB) << 20)
        decommit_locked(seg, mask);
    if (now - last_purge_ns > (uint64_t)gsi_option(GSI_OPT_PURGE_DELAY_MS) * 1000000ull)
        purge_locked(false, now);
    pthread_mutex_unlock(&segment_lock);
}

void gsi_segments_foreach(void (*fn)(struct gs_slab *, void *), void *arg)
{
    pthread_mutex_lock(&segment_lock);
    for (struct gs_segment *seg = segment_list; seg; seg = seg->next)
        for (unsigned i = 1; i < GS_SLOTS; i++)
            if (seg->slot_slab[i] == &seg->slabs[i] && seg->slabs[i].kind == GS_SLAB_SMALL)
                fn(&seg->slabs[i], arg);
    pthread_mutex_unlock(&segment_lock);
}

size_t gsi_segments_count(void)
{
    return __atomic_load_n(&segment_count, __ATOMIC_RELAXED);
}

size_t gsi_segments_decommitted(void)
{
    size_t bytes = 0;
    pthread_mutex_lock(&segment_lock);
    for (struct gs_segment *seg = segment_list; seg; seg = seg->next)
        bytes += (size_t)__builtin_popcountll(seg->free_slots & ~seg->dirty_slots) * GS_SLOT_SIZE;
    pthread_mutex_unlock(&segment_lock);
    return bytes;
}
