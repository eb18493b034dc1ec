/*
 * Segments: 4 MiB, 4 MiB-aligned mappings cut into 64 KiB slots. Slot 0
 * holds the segment header with every slab's metadata, so p -> slab is two
 * masks and one load (gsi_slab_of). A slab takes 1..16 contiguous slots
 * (its class's span, size_class.c).
 *
 * Memory return: a retired (empty) slab stays committed ("dirty") for at
 * most GRACESLAB_PURGE_DELAY_MS, so a slab that empties and refills quickly
 * costs no page faults; but never more than the empty-slab budget of
 * dirty slabs are kept, so freeing a large heap gives memory back at once,
 * with no timer. The budget is GRACESLAB_EMPTY_CACHE_MB or half the
 * committed bytes of the slabs in use, whichever is larger
 * (gsi_segments_empty_budget).
 * Segments left with no used slot are unmapped, keeping one spare. A new
 * slab of objects up to a page, for a heap that has just used up one of
 * the class, has the slots it takes without pages (never used, or given
 * back) paged in with one madvise(MADV_POPULATE_WRITE) call instead of a
 * fault per page (bench/random with 100,000-block batches, which outgrow
 * the budget every batch: 0.42 M pairs/s against 0.36 M, 7 interleaved
 * runs each, when given-back slots were first paged in; see gsi_slab_new
 * for fresh ones).
 *
 * Reuse: a retired slab whose slots stay committed keeps its format — its
 * link array holds every object on the local list — and waits on its
 * class's ready list. A new slab of that class takes it as it is: no
 * formatting, no linking, no page faults. That is the pattern of a program
 * that frees everything and allocates it again (measured on bench/random:
 * re-creating the slabs cost a fifth of its throughput and raised its
 * peak RSS). Whatever else takes or decommits one of its slots drops it from
 * the list first (unready_locked), so a READY slab's memory is always
 * intact.
 *
 * Placement: past its first slabs, a thread's heap takes slots in
 * segments it claims (place_locked), so that what one thread frees lies
 * together and the trim gives it back in runs (trim_locked). Both, and
 * the purge, look only at segments with room for what they seek ("room
 * lists"), so their cost does not grow with the heap.
 *
 * Locking: segment_lock protects the segment list, the room lists and every
 * segment's free_slots, dirty_slots, dirty_since, affinity and
 * slot_slab; a slab's kind is written under it. It is taken on slab
 * creation and retirement, and when a heap is abandoned (disown).
 */
#include "alloc/internal.h"

#include <string.h>

static pthread_mutex_t segment_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gs_segment *segment_list;
static size_t segment_count;
static size_t dirty_bytes;     /* committed bytes in unused slots (written under
                                  the lock with relaxed stores: also read as a hint) */
static size_t slab_bytes;      /* bytes of the slots of slabs in use (kind SMALL;
                                  under the lock) */
static uint64_t last_purge_ns; /* time of the last purge pass */
/* Added to the empty-slab budget after slots it gave back were needed
   again ("Refaults", below): written under the lock with relaxed stores,
   also read as a hint (heap.c's shared keep). */
static size_t budget_boost;
static uint64_t last_refault_ns; /* when the boost last grew or halved */
static size_t given_back;      /* bytes of dirty slots decommitted (under the lock) */
static struct gs_slab_list ready[GS_NCLASSES]; /* READY slabs by class (next/prev) */

/* All zero, so in .bss: the sentinel's kind is GS_SLAB_UNUSED (0) and
   its owner key 0, and every entry names it. */
struct gs_fastmap gsi_fastmap;
_Static_assert(GS_SLAB_UNUSED == 0, "the fast map's sentinel is zero-initialised");

#define ALL_SLABS (~(uint64_t)1) /* slots 1..63 */

void gsi_segments_lock(void) { pthread_mutex_lock(&segment_lock); }
void gsi_segments_unlock(void) { pthread_mutex_unlock(&segment_lock); }

void gsi_segments_atfork_child(void)
{
    pthread_mutex_unlock(&segment_lock); /* taken by this thread in prepare */
}

static uint64_t run_mask(unsigned first, unsigned n)
{
    return (n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1)) << first;
}

/* Takes the lowest run of set bits off *mask (not 0): returns its length
   and its first slot in *first. */
static unsigned take_run(uint64_t *mask, unsigned *first)
{
    unsigned at = (unsigned)__builtin_ctzll(*mask), n = 0;
    while (at + n < GS_SLOTS && (*mask >> (at + n) & 1))
        n++;
    *mask &= ~run_mask(at, n);
    *first = at;
    return n;
}

/* First run of n set bits in avail, or -1. */
static int find_run(uint64_t avail, unsigned n)
{
    for (unsigned i = 1; i + n <= GS_SLOTS; i++)
        if ((avail & run_mask(i, n)) == run_mask(i, n))
            return (int)i;
    return -1;
}

/* ---------------------------------------------------------- fast map */

static size_t fastmap_index(const struct gs_segment *seg, unsigned slot)
{
    return (((uintptr_t)seg >> GS_SLOT_SHIFT) + slot) & (((size_t)1 << GS_FASTMAP_BITS) - 1);
}

/* Relaxed stores: a reader (free) that sees an old entry only takes the
   slow path; what makes a valid free see its slab is happens-before: the
   entry is written under segment_lock before the slab is handed out, and
   the block reaches its freeing thread through the slab's owner. */
static void fastmap_write(const struct gs_segment *seg, unsigned slot, const struct gs_slab *s)
{
    uintptr_t off = (uintptr_t)s - (uintptr_t)&gsi_unused_slab; /* 0: the sentinel */
    atomic_store_explicit(&gsi_fastmap.entry[fastmap_index(seg, slot)], off, memory_order_relaxed);
}

static void fastmap_mirror(struct gs_segment *seg, bool on)
{
    seg->fastmapped = on;
    for (unsigned i = 0; i < GS_SLOTS; i++)
        fastmap_write(seg, i, on ? seg->slot_slab[i] : &gsi_unused_slab);
}

/* Sharing. 4 MiB units whose addresses are equal modulo the map's span
   (64 GiB) share entries: they form one class. Its participants are the
   live segments in it and the live large blocks whose user pointer lies
   past their mapping's first slot (a free of such a block reads the entry
   of a slot that a segment of the class may own; a block starting in slot
   0 reads a slot-0 entry, which every segment leaves 0). A segment owns the
   class's entries only while it is the class's only participant; with two
   or more, nobody does, and every participant's frees take the slow path.
   So an entry a valid free reads names metadata of the free's own segment
   or the sentinel, never a segment that could be unmapped under it
   (docs/design.md, section 1). */
#define FASTMAP_CLASSES ((size_t)1 << (GS_FASTMAP_BITS + GS_SLOT_SHIFT - GS_SEGMENT_SHIFT))
static uint16_t class_users[FASTMAP_CLASSES]; /* participants (segment_lock) */

static size_t fastmap_class(const void *unit)
{
    return ((uintptr_t)unit >> GS_SEGMENT_SHIFT) & (FASTMAP_CLASSES - 1);
}

/* The segment of class c that owns the entries, if any. */
static struct gs_segment *class_owner(size_t c)
{
    for (struct gs_segment *o = segment_list; o; o = o->next)
        if (o->fastmapped && fastmap_class(o) == c)
            return o;
    return NULL;
}

/* A participant joins class c (segment_lock): the class had one, whose
   entries, if it is a segment, are dropped. */
static void class_join(size_t c)
{
    if (class_users[c]++ == 1) {
        struct gs_segment *o = class_owner(c);
        if (o)
            fastmap_mirror(o, false);
    }
}

/* A participant (not owning the entries) left class c: if one is left and
   it is a segment, it gets them. */
static void class_leave(size_t c)
{
    if (--class_users[c] != 1)
        return;
    for (struct gs_segment *o = segment_list; o; o = o->next)
        if (fastmap_class(o) == c) {
            fastmap_mirror(o, true);
            return;
        }
}

/* A new segment, not yet on the list. */
static void fastmap_join(struct gs_segment *seg)
{
    size_t c = fastmap_class(seg);
    if (class_users[c] == 0) {
        class_users[c] = 1;
        fastmap_mirror(seg, true);
    } else {
        seg->fastmapped = false;
        class_join(c);
    }
}

/* A segment about to be unmapped, already off the list. */
static void fastmap_leave(struct gs_segment *seg)
{
    size_t c = fastmap_class(seg);
    if (seg->fastmapped) {
        fastmap_mirror(seg, false);
        class_users[c]--;
        return;
    }
    class_leave(c);
}

static bool large_participates(const void *user)
{
    return ((uintptr_t)user & GS_SEGMENT_MASK) >= GS_SLOT_SIZE;
}

void gsi_fastmap_large(const void *left, const void *joined)
{
    bool leaves = left && large_participates(left);
    bool joins = joined && large_participates(joined);
    if (!leaves && !joins)
        return;
    /* One critical section for a move: fork (which holds segment_lock)
       sees the block counted exactly once, in one class or the other. */
    pthread_mutex_lock(&segment_lock);
    if (joins)
        class_join(fastmap_class(joined));
    if (leaves)
        class_leave(fastmap_class(left));
    pthread_mutex_unlock(&segment_lock);
}

static void set_slot_locked(struct gs_segment *seg, unsigned slot, struct gs_slab *s)
{
    seg->slot_slab[slot] = s;
    if (seg->fastmapped)
        fastmap_write(seg, slot, s);
}

/* ---------------------------------------------------------- room lists */

/* Where placement, the trim and the purge look, instead of at every
   segment: a full segment, or one whose free slots are a leftover too
   short for the slab (63 slots rarely divide by a span), must cost them
   nothing, or a new slab's cost grows with the heap. perf put a fifth of
   an 8 GiB build of 1 KiB blocks in those walks; bench/bigheap built
   4 GiB in 13.7 s without the lists, 11.3 s with them, and after a
   random-order free, which leaves every segment with free slots but no
   committed ones, rebuilt half of it in 6.1 s against 3.6 (it walked
   every segment twice per new slab, looking for committed slots).

   open_runs[n] lists the segments whose longest run of free slots is n
   slots (1..63), the one changed last first; dirty_list, the segments
   with a committed free slot (dirty slots are free slots), newest first,
   the order of segment_list: on large-33K-256K-1000 that order gave 1.12
   M replacements/s (1.10 before the lists), the segment that got its
   first dirty slot last first 1.00 M, the one that got a dirty slot last
   first 1.02 M (7 interleaved runs each, pinned), with more page faults
   and madvise calls. */
static struct gs_segment *open_runs[GS_SLOTS];
static struct gs_segment *dirty_list, *dirty_tail;
static uint64_t segments_made; /* the next segment's seq */

static unsigned longest_run(uint64_t mask)
{
    unsigned longest = 0;
    while (mask) {
        unsigned first, n = take_run(&mask, &first);
        longest = n > longest ? n : longest;
    }
    return longest;
}

/* After seg->free_slots or seg->dirty_slots changed: files seg by its
   longest free run and whether it has dirty slots. */
static void room_update_locked(struct gs_segment *seg)
{
    unsigned run = longest_run(seg->free_slots);
    if (run != seg->open_run) {
        if (seg->open_run) {
            if (seg->open_prev)
                seg->open_prev->open_next = seg->open_next;
            else
                open_runs[seg->open_run] = seg->open_next;
            if (seg->open_next)
                seg->open_next->open_prev = seg->open_prev;
        }
        seg->open_run = (uint8_t)run;
        seg->open_prev = NULL;
        seg->open_next = run ? open_runs[run] : NULL;
        if (run) {
            if (seg->open_next)
                seg->open_next->open_prev = seg;
            open_runs[run] = seg;
        }
    }
    bool dirty = seg->dirty_slots != 0;
    if (dirty == seg->on_dirty_list)
        return;
    seg->on_dirty_list = dirty;
    if (!dirty) {
        if (seg->dirty_prev)
            seg->dirty_prev->dirty_next = seg->dirty_next;
        else
            dirty_list = seg->dirty_next;
        if (seg->dirty_next)
            seg->dirty_next->dirty_prev = seg->dirty_prev;
        else
            dirty_tail = seg->dirty_prev;
        return;
    }
    /* Before the first older segment: at the tail at once if seg is older
       than all (a program freeing its oldest memory last), at the head if
       newer (its newest last); otherwise a walk over the newer ones. */
    struct gs_segment *at = dirty_tail && dirty_tail->seq > seg->seq ? NULL : dirty_list;
    while (at && at->seq > seg->seq)
        at = at->dirty_next;
    seg->dirty_next = at;
    seg->dirty_prev = at ? at->dirty_prev : dirty_tail;
    if (seg->dirty_prev)
        seg->dirty_prev->dirty_next = seg;
    else
        dirty_list = seg;
    if (at)
        at->dirty_prev = seg;
    else
        dirty_tail = seg;
}

/* ---------------------------------------------------------- segments */

static struct gs_segment *segment_new_locked(void)
{
    /* Map without the lock held would allow two threads to map at once;
       mapping is rare (one per 63 slabs) and the lock keeps it simple. */
    struct gs_segment *seg = gsi_os_map_aligned(GS_SEGMENT_SIZE, GS_SEGMENT_SIZE);
    if (!seg)
        return NULL;
    seg->magic = GS_SEGMENT_MAGIC;
    seg->seq = segments_made++;
    seg->free_slots = ALL_SLABS;
    seg->dirty_slots = 0;
    seg->stale_slots = 0;
    seg->trimmed_slots = 0;
    seg->refault_slots = 0;
    for (unsigned i = 0; i < GS_SLOTS; i++)
        seg->slot_slab[i] = &gsi_unused_slab;
    fastmap_join(seg);
    seg->next = segment_list;
    seg->prev = NULL;
    if (segment_list)
        segment_list->prev = seg;
    segment_list = seg;
    seg->open_run = 0;
    seg->on_dirty_list = false;
    room_update_locked(seg);
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
    seg->free_slots = 0;
    room_update_locked(seg); /* off the lists (it has no dirty slot) */
    __atomic_store_n(&segment_count, segment_count - 1, __ATOMIC_RELAXED);
    fastmap_leave(seg);
    gsi_map_clear(seg, GS_SEGMENT_SIZE);
    gsi_os_unmap(seg, GS_SEGMENT_SIZE);
}

/* Drops every READY slab that has a slot in mask: its slots are about to
   be reused or decommitted. */
static void unready_locked(struct gs_segment *seg, uint64_t mask)
{
    uint64_t hit = seg->ready_slots & mask;
    while (hit) {
        /* READY slabs do not overlap, so the nearest READY start at or
           below a marked slot is the slab holding it. */
        unsigned first = (unsigned)__builtin_ctzll(hit);
        while (seg->slabs[first].kind != GS_SLAB_READY)
            first--;
        struct gs_slab *s = &seg->slabs[first];
        uint64_t span = run_mask(first, s->span);
        gsi_heap_list_remove(&ready[s->cls], s);
        s->kind = GS_SLAB_UNUSED;
        seg->ready_slots &= ~span;
        hit &= ~span;
    }
}

/* Gives back the dirty slots of mask, which lie in one run of free slots
   with no other dirty slot between them: one madvise from the first to
   the last, over the free slots between them, which hold no pages (given
   back already, or never used), so that threads' frees in a random order
   still go back in a few calls. (A dirty slot between them may be a READY
   slab's, whose memory must stay intact.) */
static void decommit_bridged_locked(struct gs_segment *seg, uint64_t mask)
{
    unsigned lo = (unsigned)__builtin_ctzll(mask), hi = 63u - (unsigned)__builtin_clzll(mask);
    uint64_t span = run_mask(lo, hi - lo + 1);
    GS_ASSERT((seg->free_slots & span) == span && (seg->dirty_slots & span) == mask);
    unready_locked(seg, mask);
    seg->dirty_slots &= ~mask;
    room_update_locked(seg);
    /* The slots' bytes are zero now, unless madvise failed (mlock'd
       pages): then they are still there, and calloc must not count on a
       new slab's zero bytes (gsi_slab_new). */
    if (gsi_os_decommit((char *)seg + (size_t)lo * GS_SLOT_SIZE,
                        (size_t)(hi - lo + 1) * GS_SLOT_SIZE))
        seg->stale_slots &= ~span;
    else
        seg->stale_slots |= mask;
    size_t bytes = (size_t)__builtin_popcountll(mask) * GS_SLOT_SIZE;
    __atomic_store_n(&dirty_bytes, dirty_bytes - bytes, __ATOMIC_RELAXED);
    given_back += bytes;
}

/* Gives back the dirty slots of mask: one call per run of free slots
   that holds no dirty slot outside mask. */
static void decommit_locked(struct gs_segment *seg, uint64_t mask)
{
    GS_ASSERT((seg->dirty_slots & mask) == mask);
    for (uint64_t runs = seg->free_slots & ~(seg->dirty_slots & ~mask); runs;) {
        unsigned first, n = take_run(&runs, &first);
        uint64_t in_run = mask & run_mask(first, n);
        if (in_run)
            decommit_bridged_locked(seg, in_run);
    }
}

/* Returns the bytes given back: slots decommitted, and segments unmapped
   (less what of them this pass decommitted first). An allocation that
   failed retries only if this is not 0, and with no empty-slab budget
   every slot is decommitted before any purge: the unmapped segments are
   then all it gives back. */
static size_t purge_locked(bool force, uint64_t now)
{
    uint64_t delay = (uint64_t)gsi_option(GSI_OPT_PURGE_DELAY_MS) * 1000000ull;
    size_t given = 0;
    struct gs_segment *spare = NULL; /* one wholly unused segment stays mapped */
    last_purge_ns = now;
    if (budget_boost && now > last_refault_ns &&
        now - last_refault_ns >= (uint64_t)gsi_option(GSI_OPT_DECAY_MS) * 1000000ull) {
        __atomic_store_n(&budget_boost, budget_boost / 2, __ATOMIC_RELAXED);
        last_refault_ns = now;
    }
    for (struct gs_segment *seg = dirty_list, *next; seg; seg = next) {
        next = seg->dirty_next;
        uint64_t old = 0;
        for (uint64_t m = seg->dirty_slots; m; m &= m - 1) {
            unsigned i = (unsigned)__builtin_ctzll(m);
            /* `now` was read before this thread took the lock, so a slot
               another thread retired meanwhile can be newer than it: such
               a slot is young, not (by wraparound) ancient. */
            if (force || (now > seg->dirty_since[i] && now - seg->dirty_since[i] >= delay))
                old |= (uint64_t)1 << i;
        }
        if (!old)
            continue;
        size_t dirty = dirty_bytes;
        decommit_locked(seg, old); /* may take seg off the dirty list */
        size_t decommitted = dirty - dirty_bytes;
        given += decommitted;
        if (seg->free_slots == ALL_SLABS && !seg->dirty_slots) {
            if (spare || force) {
                segment_free_locked(seg);
                given += GS_SEGMENT_SIZE - decommitted;
            } else {
                spare = seg;
            }
        }
    }
    /* Wholly unused segments that had no dirty slot before this pass. */
    for (struct gs_segment *seg = open_runs[GS_SLOTS - 1], *next; seg; seg = next) {
        next = seg->open_next;
        if (seg == spare || seg->dirty_slots)
            continue;
        if (spare || force) {
            segment_free_locked(seg);
            given += GS_SEGMENT_SIZE;
        } else {
            spare = seg;
        }
    }
    return given;
}

/* The empty-slab budget: dirty slots plus the heaps' shared keep (heap.c)
   stay within GRACESLAB_EMPTY_CACHE_MB or half the bytes of the slabs in
   use, whichever is larger. A fixed 32 MiB was too little for a program
   whose working set is several times that and whose slabs are large: 1000
   live blocks of 33..256 KiB (medium classes, slabs of up to 1 MiB), each
   replacement freeing the oldest, emptied a slab every few operations,
   the cap decommitted it at once and the next ones faulted it back:
   95,000 replacements/s against jemalloc's 600,000. What stays committed
   is still bounded by what the program uses, and falls with it (see
   trim_locked). Read under the lock by retire and trim, as a hint by the
   heaps' shared keep (heap.c). */
size_t gsi_segments_empty_budget(void)
{
    size_t option = (size_t)gsi_option(GSI_OPT_EMPTY_CACHE_MB) << 20;
    /* Of the slabs' bytes, those still committed: medium objects whose
       pages went back (decay.c) hold no memory. A thread that freed 3 in
       4 of 2000 medium blocks at random and exited (bench/threadexit)
       left 57 MB live in slabs its orphans' decommits had thinned out;
       with their span counted, 148 MB stayed resident, 109 MB without. */
    size_t bytes = __atomic_load_n(&slab_bytes, __ATOMIC_RELAXED);
    int64_t decayed = atomic_load_explicit(&gsi_decayed_bytes, memory_order_relaxed);
    if (decayed > 0)
        bytes = (size_t)decayed < bytes ? bytes - (size_t)decayed : 0;
    size_t half = bytes / 2;
    /* The boost and the heaps' own keeps share one room ("Refaults"). */
    size_t boost = __atomic_load_n(&budget_boost, __ATOMIC_RELAXED), own = gsi_heap_own_kept_bytes();
    option += boost > own ? boost - own : 0;
    return half > option ? half : option;
}

/* Refaults. The budget gives back the empty slabs past it at once, which
   is right for a program that has freed its heap for good, and wrong for
   one that frees and builds it again and again: 100 strings grown side by
   side with realloc to 200 KB, then freed, 50 rounds, left 48 MB of empty
   slabs of every class they passed through after each round; the 32 MiB
   budget gave 16 of them back and the next round faulted them in again
   (290,000 page faults and 1.8x jemalloc's time, 57,000 faults on
   jemalloc). So a slot the budget gives back is marked (trimmed_slots,
   with the time in dirty_since), a slab made on it within a decay period
   (GRACESLAB_DECAY_MS) marks it again (refault_slots), and when that slab
   retires with at least three quarters of those slots' pages resident,
   the program touched them again: their resident bytes are added to the
   boost, up to GRACESLAB_EMPTY_CACHE_MB, and the budget grows by what of
   the boost the heaps' own keeps (GRACESLAB_HEAP_EMPTY_TOTAL_MB, 32 MiB)
   leave: the two share one room, so what a program keeps committed after
   freeing everything, with no further call, is bounded as before (32 MiB
   and the own keeps), and freeing 512 MiB of small objects still gives
   back 80 % within a second when no purge runs. A boost of three times
   the option broke that promise (a review's program, boost at its cap:
   166 MiB resident a second after, against at most 133), and so did one
   of the option added beside full own keeps (32 threads freeing the 512
   MiB and staying alive: 135 MiB against 132). The boost halves at a
   purge pass (which a slab's creation or retirement makes) a decay
   period after it last grew or halved; an idle program keeps it. Residency decides, not reuse alone,
   because a program that leaves most of a block untouched loses little
   when its slots go back, and kept committed they must be cleared in full
   for its next calloc: bench/calloc (3200 live 64 KiB blocks, one byte
   written in each) peaked at 142 MB instead of 50 when every reuse
   counted; for the same reason a slab one of whose blocks calloc
   cleared drops its mark (gsi_slab_cleared): the heap's active slab,
   which stays from one round to the next, and the slabs it keeps, had
   every block cleared in full when calloc reused them, and raised the
   boost to its cap on bench/calloc once medium slabs held 16 blocks
   (78 MB peak RSS; 49 with the mark dropped, 47 before). (Pages that
   MADV_POPULATE_WRITE paged in count as touched:
   they were, for a slab whose class the heap has just used up.) A program
   that never needs a given-back slot again keeps the plain budget. */
static size_t boost_cap(void)
{
    return (size_t)gsi_option(GSI_OPT_EMPTY_CACHE_MB) << 20;
}

/* A slab is made on the slots of mask (lock held). */
static void mark_refault_locked(struct gs_segment *seg, uint64_t mask)
{
    uint64_t trimmed = seg->trimmed_slots & mask;
    seg->trimmed_slots &= ~mask;
    if (!boost_cap())
        return;
    uint64_t period = (uint64_t)gsi_option(GSI_OPT_DECAY_MS) * 1000000ull;
    uint64_t now = gsi_now_ns();
    for (; trimmed; trimmed &= trimmed - 1) {
        unsigned i = (unsigned)__builtin_ctzll(trimmed);
        if (now - seg->dirty_since[i] < period)
            __atomic_store_n(&seg->refault_slots, seg->refault_slots | (uint64_t)1 << i,
                             __ATOMIC_RELAXED);
    }
}

/* The slab on the slots of mask retires (lock held). One refaulted slab
   in 8 has its refaulted slots' residency read, and stands for the 8:
   mincore took 1.6 us for 80 pages here, and reading every one made
   bench/calloc (64 KiB blocks, a slab retired every few frees, each
   refaulted but with 5 of its 80 pages resident) 9 % slower. Where
   mincore fails, nothing counts. */
static void note_refault_locked(struct gs_segment *seg, uint64_t mask, uint64_t now)
{
    static unsigned turn;
    uint64_t slots = seg->refault_slots & mask;
    if (!slots)
        return;
    __atomic_store_n(&seg->refault_slots, seg->refault_slots & ~mask, __ATOMIC_RELAXED);
    if (turn++ % 8)
        return;
    size_t bytes = (size_t)__builtin_popcountll(slots) * GS_SLOT_SIZE, resident = 0;
    for (uint64_t runs = slots; runs;) {
        unsigned at, n = take_run(&runs, &at);
        resident += gsi_os_resident_bytes((char *)seg + (size_t)at * GS_SLOT_SIZE,
                                          (size_t)n * GS_SLOT_SIZE, false);
    }
    if (resident < bytes / 4 * 3)
        return;
    size_t cap = boost_cap(), boost = budget_boost + 8 * resident;
    __atomic_store_n(&budget_boost, boost < cap ? boost : cap, __ATOMIC_RELAXED);
    last_refault_ns = now;
}

/* Reads refault_slots without the lock first (relaxed; it is written
   under the lock with relaxed stores): a stale reading leaves the mark,
   or takes the lock for nothing. */
void gsi_slab_cleared(struct gs_slab *s)
{
    unsigned first;
    struct gs_segment *seg = gsi_slab_segment(s, &first);
    uint64_t mask = run_mask(first, s->span);
    if (GS_LIKELY(!(__atomic_load_n(&seg->refault_slots, __ATOMIC_RELAXED) & mask)))
        return;
    pthread_mutex_lock(&segment_lock);
    __atomic_store_n(&seg->refault_slots, seg->refault_slots & ~mask, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&segment_lock);
}

size_t gsi_segments_budget_boost(void)
{
    return __atomic_load_n(&budget_boost, __ATOMIC_RELAXED);
}

/* Decommits dirty slots, one run of free slots at a time, until the
   dirty bytes and the heaps' shared keep fit the budget: the budget falls
   as the program frees, and what it allowed earlier must not stay
   committed (a program that frees 512 MiB must see its RSS fall within
   the purge delay even if it makes no further call). The run holding the
   most dirty slots goes first, in one madvise over the free slots between
   them (decommit_bridged_locked), so each call covers as much as the
   program's frees left together: decommitting each slab as it went over
   the budget, then whole segments' dirty slots in list order, made one
   call per 64 KiB slot when threads free their slabs in a random order
   (perl's interpreter teardowns: 2,300 calls; about 370 with this and
   the placement in place_locked). */
static void trim_locked(uint64_t now)
{
    size_t budget = gsi_segments_empty_budget();
    while (dirty_bytes + gsi_heap_shared_kept_bytes() > budget) {
        struct gs_segment *best = NULL;
        uint64_t best_mask = 0;
        int best_n = 0;
        for (struct gs_segment *seg = dirty_list; seg; seg = seg->dirty_next)
            for (uint64_t runs = seg->free_slots; runs;) {
                unsigned first, n = take_run(&runs, &first);
                uint64_t dirty = seg->dirty_slots & run_mask(first, n);
                int count = __builtin_popcountll(dirty);
                if (count > best_n) {
                    best = seg;
                    best_mask = dirty;
                    best_n = count;
                }
            }
        if (!best)
            return; /* over budget by the shared keep alone */
        decommit_bridged_locked(best, best_mask);
        /* Not slots whose madvise failed (locked pages): they stay
           resident, and would count as touched again. */
        uint64_t given = best_mask & ~best->stale_slots;
        best->trimmed_slots |= given;
        for (uint64_t m = given; m; m &= m - 1)
            best->dirty_since[__builtin_ctzll(m)] = now;
    }
}

void gsi_segments_trim(void)
{
    /* Relaxed reads: a hint; trim_locked decides under the lock. */
    if (__atomic_load_n(&dirty_bytes, __ATOMIC_RELAXED) + gsi_heap_shared_kept_bytes() <=
        gsi_segments_empty_budget())
        return;
    uint64_t now = gsi_now_ns();
    pthread_mutex_lock(&segment_lock);
    trim_locked(now);
    pthread_mutex_unlock(&segment_lock);
}

size_t gsi_segments_purge(bool force)
{
    uint64_t now = gsi_now_ns();
    pthread_mutex_lock(&segment_lock);
    size_t n = purge_locked(force, now);
    pthread_mutex_unlock(&segment_lock);
    return n;
}

/* Takes the READY slab s (lock held): as after gsi_slab_format() and some
   extensions — unowned, on no list, every linked object free. */
static struct gs_slab *reuse_ready_locked(struct gs_slab *s)
{
    unsigned first;
    struct gs_segment *seg = gsi_slab_segment(s, &first);
    uint64_t mask = run_mask(first, s->span);
    gsi_heap_list_remove(&ready[s->cls], s);
    seg->ready_slots &= ~mask;
    seg->free_slots &= ~mask;
    seg->dirty_slots &= ~mask;
    room_update_locked(seg);
    __atomic_store_n(&dirty_bytes, dirty_bytes - (size_t)s->span * GS_SLOT_SIZE, __ATOMIC_RELAXED);
    __atomic_store_n(&slab_bytes, slab_bytes + (size_t)s->span * GS_SLOT_SIZE, __ATOMIC_RELAXED);
    GS_ASSERT(s->used == 0 && s->free_head != GS_LINK_END);
    s->where = GS_IN_NONE;
    s->orphan_next = s->orphan_prev = NULL;
    s->orphaned = false;
    s->kept_empty = false;
    s->kept_shared = false;
    s->cache = NULL;
    s->typesafe = false;
    s->idle_free = 0;
    s->idle_pass = 0;
    GS_ASSERT(s->decayed == 0); /* gsi_slab_retire forgot them */
    s->wait_cookie = 0;
    s->released_by = 0;
    atomic_store_explicit(&s->owner_key, 0, memory_order_relaxed);
    atomic_store_explicit(&s->xstate, GS_X_MAKE(0, GS_LINK_END, 0), memory_order_relaxed);
    for (int i = 0; i < GS_PENDING_CHAINS; i++)
        atomic_store_explicit(&s->pending[i], GS_P_MAKE(0, GS_LINK_END & 0xFFF, 0),
                              memory_order_relaxed);
    s->kind = GS_SLAB_SMALL;
    for (unsigned i = 0; i < s->span; i++)
        set_slot_locked(seg, first + i, s);
    return s;
}

/* The segment and first slot of a free run of span slots, in the segments
   whose affinity is `affinity` (ANY_SEGMENT: every segment), or NULL.
   Passes from..to of: committed (dirty) slots no READY slab of another
   class waits on, committed slots, any free slots. Committed first: no
   page faults, less RSS. Committed slots are looked for in the segments
   that have some (dirty_list), newest first; other free slots in the
   segments whose longest free run is shortest first (those that fit the
   slab most tightly, as best-fit allocators choose, keeping long runs
   for large slabs), or, `roomiest`, longest first (a segment a heap
   claims for the slabs it will make). */
#define ANY_SEGMENT UINT32_MAX
enum { DIRTY_NOT_READY, DIRTY, ANY_FREE };
static bool fits_locked(struct gs_segment *seg, unsigned span, uint32_t affinity, int pass,
                        int *first)
{
    if (affinity != ANY_SEGMENT && seg->affinity != affinity)
        return false;
    uint64_t avail = pass == DIRTY_NOT_READY ? seg->dirty_slots & ~seg->ready_slots
                     : pass == DIRTY         ? seg->dirty_slots
                                             : seg->free_slots;
    return avail && (*first = find_run(avail, span)) >= 0;
}

static struct gs_segment *find_slots_locked(unsigned span, uint32_t affinity, int from, int to,
                                            bool roomiest, int *first)
{
    for (int pass = from; pass <= to; pass++) {
        if (pass != ANY_FREE) {
            for (struct gs_segment *seg = dirty_list; seg; seg = seg->dirty_next)
                if (fits_locked(seg, span, affinity, pass, first))
                    return seg;
            continue;
        }
        for (unsigned i = span; i < GS_SLOTS; i++) {
            unsigned run = roomiest ? GS_SLOTS - 1 - (i - span) : i;
            for (struct gs_segment *seg = open_runs[run]; seg; seg = seg->open_next)
                if (fits_locked(seg, span, affinity, pass, first))
                    return seg;
        }
    }
    return NULL;
}

/* Where a new slab goes. A heap that passes its id (affinity) gets its
   slabs in segments of its own: its committed slots, else committed slots
   in any segment, else its other free slots, else a segment no heap
   claims (claimed), else a new one. So what one thread frees together
   lies together, and goes back to the OS in long runs instead of slot by
   slot between other threads' slabs: perl with 4 interpreter threads,
   whose teardowns free 240 MB, made 2,300 madvise calls, mostly of one
   64 KiB slot, and spent 0.15 s more in the kernel than mimalloc, whose
   segments are per thread; about 370 with this and the trim below.
   Committed slots of other heaps' segments come before faulting pages in:
   threads that take turns at jobs of 150 MB each, of classes of their
   own, otherwise faulted each job in afresh while the previous job's
   memory, committed in segments its idle thread still claimed (by the
   empty slabs its heap keeps), waited for the purge (553,000 page faults
   against 158,000, 7.7 s of CPU against 2.5; the reviewer's reproducer).
   Without an affinity (a heap's first slabs, caches), any segment,
   unclaimed first: a thread that takes one block of a few classes does
   not get 4 MiB of address space and a segment header of its own. */
static struct gs_segment *place_locked(unsigned span, uint32_t affinity, int *first)
{
    struct gs_segment *seg = NULL;
    if (affinity &&
        ((seg = find_slots_locked(span, affinity, DIRTY_NOT_READY, DIRTY, false, first)) ||
         (seg = find_slots_locked(span, ANY_SEGMENT, DIRTY_NOT_READY, DIRTY, false, first)) ||
         (seg = find_slots_locked(span, affinity, ANY_FREE, ANY_FREE, false, first))))
        return seg;
    if ((seg = find_slots_locked(span, 0, affinity ? ANY_FREE : DIRTY_NOT_READY, ANY_FREE,
                                 affinity != 0, first))) {
        seg->affinity = affinity;
        return seg;
    }
    if (!affinity &&
        (seg = find_slots_locked(span, ANY_SEGMENT, DIRTY_NOT_READY, ANY_FREE, false, first)))
        return seg;
    if ((seg = segment_new_locked())) {
        seg->affinity = affinity;
        *first = 1;
        return seg;
    }
    /* No memory for a segment: a free run anywhere will do. */
    return find_slots_locked(span, ANY_SEGMENT, DIRTY_NOT_READY, ANY_FREE, false, first);
}

void gsi_segments_disown(uint32_t affinity)
{
    pthread_mutex_lock(&segment_lock);
    for (struct gs_segment *seg = segment_list; seg; seg = seg->next)
        if (seg->affinity == affinity)
            seg->affinity = 0;
    pthread_mutex_unlock(&segment_lock);
}

struct gs_slab *gsi_slab_new(unsigned cls, bool populate, uint32_t affinity)
{
    unsigned span = gsi_classes[cls].span;
    pthread_mutex_lock(&segment_lock);
    if (ready[cls].first) {
        struct gs_slab *s = reuse_ready_locked(ready[cls].first);
        pthread_mutex_unlock(&segment_lock);
        return s;
    }
    int first = -1;
    struct gs_segment *found = place_locked(span, affinity, &first);
    if (!found) {
        pthread_mutex_unlock(&segment_lock);
        return NULL;
    }
    uint64_t mask = run_mask((unsigned)first, span);
    unready_locked(found, mask);
    /* Slots without pages (never used, or given back by the cap or a
       purge): paged in below in one call when the caller's demand says
       this slab will be used through (it just used up one of the class).
       A fault per page costs more: on this project's VM, 1 GiB paged in
       by touching each page took 4.2 to 4.4 s, in 64 KiB madvise calls
       2.2 to 3.2 s; bench/bigheap built 4 GiB of 1 KiB blocks in 6.5 s
       against 11.6 when only given-back slots were paged in (3 runs), and
       perl's workload ran in 2.09 s of CPU against 2.58 (5 runs; the same
       peak RSS in both). Not without that demand: a thread's first slab of a
       class may hold one object for good (16 threads taking one object of
       each class up to 4 KiB added 31 MiB of RSS when every new slab was
       paged in, 3.7 MiB without). Nor for objects above a page (a program
       may leave most pages of a big block untouched: paging them in would
       raise its RSS, not only save faults). Dirty slots have their pages. */
    uint64_t page_in = populate && gsi_classes[cls].size <= GS_PAGE
                           ? mask & ~found->dirty_slots
                           : 0;
    size_t dirty = (size_t)__builtin_popcountll(found->dirty_slots & mask);
    /* Slots neither dirty nor stale hold only zero bytes: never used since
       the segment was mapped, or given back (MADV_DONTNEED). */
    bool zero = !((found->dirty_slots | found->stale_slots) & mask);
    __atomic_store_n(&dirty_bytes, dirty_bytes - dirty * GS_SLOT_SIZE, __ATOMIC_RELAXED);
    found->free_slots &= ~mask;
    found->dirty_slots &= ~mask;
    room_update_locked(found);
    __atomic_store_n(&slab_bytes, slab_bytes + (size_t)span * GS_SLOT_SIZE, __ATOMIC_RELAXED);
    struct gs_slab *s = &found->slabs[first];
    gsi_slab_format(s, (char *)found + (size_t)first * GS_SLOT_SIZE, cls);
    if (zero && cls >= GS_FIRST_MEDIUM_CLASS)
        s->zero_from = 0; /* see struct gs_slab */
    if (found->trimmed_slots & mask)
        mark_refault_locked(found, mask);
    s->kind = GS_SLAB_SMALL;
    for (unsigned i = 0; i < span; i++)
        set_slot_locked(found, (unsigned)first + i, s);
    uint64_t now = 0;
    if (dirty_bytes && (now = gsi_now_ns()) - last_purge_ns >
                           (uint64_t)gsi_option(GSI_OPT_PURGE_DELAY_MS) * 1000000ull)
        purge_locked(false, now);
    pthread_mutex_unlock(&segment_lock);
    /* Outside the lock: nobody else reaches these slots until the caller
       hands the slab out (a purge takes only free slots, and a sweep skips
       a slab with nothing pending or remote). */
    while (page_in) {
        unsigned at, n = take_run(&page_in, &at);
        gsi_os_populate((char *)found + (size_t)at * GS_SLOT_SIZE, (size_t)n * GS_SLOT_SIZE);
    }
    return s;
}

void gsi_slab_retire(struct gs_slab *s)
{
    unsigned first;
    struct gs_segment *seg = gsi_slab_segment(s, &first);
    uint64_t mask = run_mask(first, s->span);
    uint64_t now = gsi_now_ns();
    /* No thread's fast path may match it any more (its owner calls this). */
    atomic_store_explicit(&s->owner_key, 0, memory_order_relaxed);
    gsi_decay_forget(s);
    pthread_mutex_lock(&segment_lock);
    GS_ASSERT(s->kind == GS_SLAB_SMALL);
    s->kind = GS_SLAB_UNUSED;
    note_refault_locked(seg, mask, now);
    for (unsigned i = 0; i < s->span; i++) {
        set_slot_locked(seg, first + i, &gsi_unused_slab);
        seg->dirty_since[first + i] = now;
    }
    seg->free_slots |= mask;
    seg->dirty_slots |= mask;
    room_update_locked(seg);
    __atomic_store_n(&dirty_bytes, dirty_bytes + (size_t)s->span * GS_SLOT_SIZE, __ATOMIC_RELAXED);
    __atomic_store_n(&slab_bytes, slab_bytes - (size_t)s->span * GS_SLOT_SIZE, __ATOMIC_RELAXED);
    if (seg->free_slots == ALL_SLABS)
        seg->affinity = 0; /* anyone's to claim */
    if (s->free_head != GS_LINK_END) {
        /* Empty (used == 0, nothing pending or remote): every object it
           ever linked is on its local list. */
        s->kind = GS_SLAB_READY;
        seg->ready_slots |= mask;
        gsi_heap_list_push(&ready[s->cls], s);
    }
    /* The heaps' shared keep is part of the same cache (heap.c); the
       budget may also have fallen below older dirty slots. */
    trim_locked(now);
    if (now - last_purge_ns > (uint64_t)gsi_option(GSI_OPT_PURGE_DELAY_MS) * 1000000ull)
        purge_locked(false, now);
    pthread_mutex_unlock(&segment_lock);
}

size_t gsi_segments_dirty_bytes(void)
{
    return __atomic_load_n(&dirty_bytes, __ATOMIC_RELAXED);
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

size_t gsi_segments_list(struct gs_segment **out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&segment_lock);
    for (struct gs_segment *seg = segment_list; seg; seg = seg->next, n++)
        if (n < max)
            out[n] = seg;
    pthread_mutex_unlock(&segment_lock);
    return n;
}

size_t gsi_segments_count(void)
{
    return __atomic_load_n(&segment_count, __ATOMIC_RELAXED);
}

size_t gsi_segments_given_back(void)
{
    pthread_mutex_lock(&segment_lock);
    size_t bytes = given_back;
    pthread_mutex_unlock(&segment_lock);
    return bytes;
}

long gsi_segments_open_check(unsigned min_run)
{
    long listed = 0, roomy = 0, open = 0, dirty_listed = 0, dirty = 0;
    bool ok = true;
    pthread_mutex_lock(&segment_lock);
    for (unsigned run = 1; run < GS_SLOTS; run++)
        for (struct gs_segment *seg = open_runs[run], *prev = NULL; seg;
             prev = seg, seg = seg->open_next) {
            ok &= seg->open_prev == prev && seg->open_run == run &&
                  longest_run(seg->free_slots) == run;
            listed++;
            roomy += run >= min_run;
        }
    struct gs_segment *last = NULL;
    for (struct gs_segment *seg = dirty_list; seg; last = seg, seg = seg->dirty_next) {
        ok &= seg->dirty_prev == last && seg->on_dirty_list && seg->dirty_slots != 0 &&
              (!last || last->seq > seg->seq);
        dirty_listed++;
    }
    ok &= dirty_tail == last;
    for (struct gs_segment *seg = segment_list; seg; seg = seg->next) {
        open += seg->free_slots != 0;
        dirty += seg->dirty_slots != 0;
        ok &= (seg->dirty_slots & ~seg->free_slots) == 0;
    }
    pthread_mutex_unlock(&segment_lock);
    return ok && listed == open && dirty_listed == dirty ? roomy : -1;
}

long gsi_segments_full_in_use(uint32_t owner)
{
    long n = 0;
    pthread_mutex_lock(&segment_lock);
    for (struct gs_segment *seg = segment_list; seg; seg = seg->next) {
        bool in_use = !seg->free_slots;
        for (unsigned i = 1; in_use && i < GS_SLOTS; i++) {
            const struct gs_slab *s = seg->slot_slab[i];
            /* (A racy read of another heap's count: this is for tests
               whose other threads are done.) */
            in_use = s != &seg->slabs[i] || s->used != 0 ||
                     GS_X_OWNER(atomic_load_explicit(&s->xstate, memory_order_relaxed)) == owner;
        }
        n += in_use;
    }
    pthread_mutex_unlock(&segment_lock);
    return n;
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
