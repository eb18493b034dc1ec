/*
 * graceslab allocator internals: every struct, with the owner and the
 * readers of each field, and the prototypes shared between alloc/ files,
 * grouped by the file that defines them.
 *
 * Data flow of a malloc: malloc.c (override layer) -> heap.c (thread heap,
 * per-class active slab) -> slab.c (object lists inside a slab) ->
 * segment.c (slabs carved from 4 MiB segments) -> os.c (mmap/madvise).
 * Large blocks: malloc.c -> large.c -> os.c.
 * A gs_free_rcu goes to the slab's pending chains (pending.c) and leaves
 * through the heap's refill path (heap.c -> pending.c).
 *
 * Concurrency summary (details on each struct and in docs/design.md):
 *   - A slab has at most one owner heap at a time. Only the owner touches
 *     the owner fields (free list, used, bump, list links); ownership moves
 *     by CAS on slab->xstate (release on give-up, acquire on take).
 *   - Other threads free into an owned slab through the lock-free remote
 *     chain in xstate; into an ownerless slab they adopt it (CAS) first.
 *   - gs_free_rcu pushes onto one of four pending chains (lock-free, any
 *     thread, owned or not); the chain word carries the grace-period cookie.
 *   - Locks: segment_lock (segment.c) protects segments and their slot maps;
 *     each class's orphan_lock protects the orphan list; large_lock (large.c)
 *     the large-block cache; heap_lock (heap.c) the heap table and pool.
 *     Lock order: heap_lock -> orphan_lock[c] -> segment_lock -> large_lock
 *     (-> vg_sizes.c's table lock, under Valgrind only: a leaf).
 *     No lock is held across a call into rcu/ that may block.
 */
#ifndef GS_ALLOC_INTERNAL_H
#define GS_ALLOC_INTERNAL_H

#include "alloc/common.h"
#include "include/graceslab.h"
#include "alloc/vg.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* ---------------------------------------------------------------------
 * Geometry
 * --------------------------------------------------------------------- */
#define GS_SEGMENT_SHIFT 22                       /* 4 MiB segments */
#define GS_SEGMENT_SIZE  ((uintptr_t)1 << GS_SEGMENT_SHIFT)
#define GS_SEGMENT_MASK  (GS_SEGMENT_SIZE - 1)
#define GS_SLOT_SHIFT    16                       /* 64 KiB slots */
/* Bytes of user address space on x86_64 without an mmap hint above it. */
#define GS_ADDRESS_SPACE ((size_t)1 << 47)
#define GS_SLOT_SIZE     ((size_t)1 << GS_SLOT_SHIFT)
#define GS_SLOTS         (GS_SEGMENT_SIZE / GS_SLOT_SIZE) /* 64; slot 0 = header */
#define GS_PAGE          4096
/* A thread's heap claims segments of its own from its ninth new slab on
   (segment.c, place_locked): a thread that allocates little shares them. */
#define GS_HEAP_CLAIM_AFTER 8
#define GS_ADDR_BITS     47                       /* x86_64 user space */

/* Size classes: 16..128 by 16, then 8 classes per doubling up to 256 KiB.
   Above GS_SMALL_MAX a request is a large block (large.c). The classes
   above GS_DIRECT_MAX ("medium", 36 KiB..256 KiB) are slabs like the
   others; only malloc finds them by computing the class instead of by
   direct[] (which would need 1,792 more entries per heap for them). They
   used to be large blocks, each its own mapping: 100,000 live 40 KB
   blocks took 100,000 mappings (the kernel's limit is 65,530) and their
   page tables. */
#define GS_SMALL_MAX     262144
#define GS_DIRECT_MAX    32768
#define GS_NCLASSES      96
#define GS_FIRST_MEDIUM_CLASS 72 /* the first class above GS_DIRECT_MAX */

/* malloc's direct[] (size -> active slab, struct gs_heap): one entry per
   16 bytes up to 1024 ((size + 15) >> 4: entries 0..64), then one per 128
   bytes up to GS_DIRECT_MAX (entries 65..312): every class boundary above
   1 KiB is a multiple of 128, so an entry names one class. */
#define GS_DIRECT_BASE_ABOVE_1K ((1024 >> 4) - (1024 >> 7)) /* both formulas give 64 at 1024 */
#define GS_DIRECT_ENTRIES (GS_DIRECT_BASE_ABOVE_1K + (GS_DIRECT_MAX >> 7) + 1)
#define GS_DIRECT_INDEX_ABOVE_1K(size) (GS_DIRECT_BASE_ABOVE_1K + (((size) + 127) >> 7))
/* The direct[] entry of any size <= GS_DIRECT_MAX (gs_malloc branches on the
   size instead, to test for larger blocks on the way). */
#define GS_DIRECT_INDEX(size) ((size) <= 1024 ? ((size) + 15) >> 4 : GS_DIRECT_INDEX_ABOVE_1K(size))

/* ---------------------------------------------------------------------
 * Per-object state, out of band: one 16-bit link per object, in an array
 * in the segment header (classes of up to GS_SLOT_LINK_BYTES / 2 - 1
 * objects a slab) or near the front of the slab, before the first object
 * (the smallest classes). Never inside the object, so pending objects stay
 * untouched for readers.
 *   GS_LINK_ALLOCATED      object handed out
 *   0..GS_LINK_END         free, on the owner's local list (value = next)
 *   GS_LINK_REMOTE | next  freed by another thread, on the remote chain
 *   GS_LINK_PENDING | next gs_free_rcu'd, on a pending chain
 *   GS_LINK_INVALID        sentinel after the last object (catches
 *                          pointers into the slab's tail)
 *   GS_LINK_UNUSED         never linked since the slab was formatted (the
 *                          bytes there may have been another slab's
 *                          objects: without it a free of an object never
 *                          handed out could read 0xFFFF and be accepted)
 * --------------------------------------------------------------------- */
#define GS_LINK_ALLOCATED 0xFFFFu
#define GS_LINK_INVALID   0xFFFEu
#define GS_LINK_UNUSED    0x2020u /* two equal bytes: formatting memsets it */
#define GS_LINK_END       0x0FFFu
#define GS_LINK_INDEX     0x0FFFu
#define GS_LINK_REMOTE    0x4000u
#define GS_LINK_PENDING   0x8000u
#define GS_MAX_OBJECTS    (GS_LINK_END - 1)
/* Bytes of link array the segment header holds for each slot: a slab whose
   class has fewer than GS_SLOT_LINK_BYTES / 2 objects keeps its links there
   (size_class.c, "Where the links live"). 64 of them fit in slot 0 beside
   the slab metadata. */
#define GS_SLOT_LINK_BYTES 768

/* ---------------------------------------------------------------------
 * slab->xstate: owner id (bits 32..63, 0 = ownerless), remote chain head
 * (bits 16..31), remote chain length (bits 0..15).
 * --------------------------------------------------------------------- */
#define GS_X_OWNER(x)  ((uint32_t)((x) >> 32))
#define GS_X_HEAD(x)   ((uint32_t)((x) >> 16) & 0xFFFFu)
#define GS_X_COUNT(x)  ((uint32_t)(x) & 0xFFFFu)
#define GS_X_MAKE(owner, head, count)                                          \
    (((uint64_t)(owner) << 32) | ((uint64_t)(head) << 16) | (uint64_t)(count))

/* Pending chains: 4 per slab; a word is cookie (bits 24..63, grace-period
   sequence value), head (bits 12..23), length (bits 0..11). */
#define GS_PENDING_CHAINS 4
#define GS_P_COOKIE(w) ((w) >> 24)
#define GS_P_HEAD(w)   ((uint32_t)((w) >> 12) & 0xFFFu)
#define GS_P_COUNT(w)  ((uint32_t)(w) & 0xFFFu)
#define GS_P_MAKE(cookie, head, count)                                         \
    (((uint64_t)(cookie) << 24) | ((uint64_t)(head) << 12) | (uint64_t)(count))

struct gs_heap;
struct gs_cache;

enum gs_slab_kind {
    GS_SLAB_UNUSED = 0,  /* slot is free in its segment */
    GS_SLAB_SMALL,       /* formatted slab of a size class */
    GS_SLAB_READY,       /* retired, slots still committed, format kept
                            (every object on the local list): reusable as
                            is for its class (segment.c) */
};

/*
 * A slab: one size class, `span` slots of 64 KiB. The metadata lives in the
 * segment header (out of band), and so does the link array of all but the
 * smallest classes, whose link array lives near the front of the slab's own
 * memory (before the first object, at a per-slab colour offset).
 *
 * Invariant (owner's view, outside an operation), for a slab that is not
 * its heap's active slab:
 *   capacity == used + |local list| + (capacity - bump)
 *   used counts objects that are allocated, on the remote chain, or pending.
 * The active slab's `used` is instead charged with GS_ACTIVE_CHARGE when
 * it becomes active and recounted when it stops being active
 * (gsi_slab_recount): while active, malloc does not count (no
 * read-modify-write on the malloc fast path) and frees and reclaims only
 * subtract, so the free fast path never sees it reach zero.
 * A slab with an owner is that heap's active slab for its class, or on its
 * partial list, or on its waiting list (pending objects only), or on its
 * full list (used up, kept owned: heap.c, "Full slabs"). A parked slab
 * (GS_IN_PARKED, on the full list) has `used` == 1 instead of capacity, so
 * that the owner's first free into it reaches zero and takes the slow path.
 */
struct gs_slab {
    /* Fast-path fields first, and the struct 64-byte aligned: free reads
       the first line and `shift`, malloc the first line and `obj_size`.
       In the old order, at the old (unaligned) offset in the segment
       header, a free touched four lines, one of them shared with xstate,
       which remote freers write. */
    /* Mirror of the owner for the free fast path: the owner heap's key
       (gs_heap.key: its thread's thread pointer), 0 when ownerless. Written
       by the thread that takes or gives up ownership (relaxed; see slab.c),
       read by any thread only to compare with its own key, which cannot
       race: a slab stops being "mine" only by my own write. */
    _Atomic uintptr_t owner_key;
    /* --- owner fields: read and written by the owner heap only (or by
       the thread holding the segment lock while the slab is unused) --- */
    uint16_t *link;          /* per-object links, capacity + 1 entries */
    char *start;             /* first object */
    /* Index of an address (gsi_slab_index): exact division of the offset
       by obj_size = odd << shift, by the odd part's inverse and a rotate. */
    uint64_t inverse;
    uint64_t limit;          /* == capacity, 64-bit for the compare */
    uint64_t free_head;      /* local free list head, GS_LINK_END if empty
                                (64-bit: an index register as loaded) */
    char *free_ptr;          /* address of object free_head (cached so that
                                malloc returns it without a multiply on the
                                free -> malloc dependency chain) */
    uint64_t used;           /* see invariant above */
    /* (second line) */
    uint64_t obj_size;       /* bytes per object (class size); 64-bit so
                                that the multiply takes it from memory */
    uint8_t shift;
    uint8_t cls;             /* size class */
    uint8_t span;            /* slots covered */
    uint8_t kind;            /* enum gs_slab_kind (segment lock) */
    uint32_t capacity;       /* objects in the slab */
    uint32_t bump;           /* objects [bump, capacity) never linked yet */
    uint8_t where;           /* enum gs_slab_where: which heap list */
    bool kept_empty;         /* empty, kept on the partial list for reuse
                                (counted in heap->empty_bytes, or if
                                kept_shared in the shared keep budget) */
    bool kept_shared;        /* kept_empty, charged to the shared budget */
    bool typesafe;           /* of a GS_CACHE_TYPESAFE_BY_RCU cache: its
                                freed objects stay readable (memcheck) */
    uint16_t idle_free;      /* medium slabs: objects on the local list at
                                the decay pass numbered idle_pass (decay.c) */
    uint16_t decayed;        /* medium slabs: free objects whose pages decay
                                gave back, not handed out since (decay.c) */
    uint32_t idle_pass;
    struct gs_slab *next, *prev; /* heap partial/waiting list (owner) */
    struct gs_slab *orphan_next, *orphan_prev; /* orphan list (orphan_lock) */
    struct gs_cache *cache;  /* owning dedicated cache, NULL for malloc */
    union {
        uint64_t wait_cookie; /* waiting list: cookie it waits for */
        struct {
            /* kept list: its heap's decay_pass when it was kept (heap.c,
               gsi_heap_retire_idle_kept) */
            uint32_t kept_pass;
            /* and its heap's keep_seq then: the newest kept medium slab
               is the one a new medium class reuses (heap.c) */
            uint32_t kept_seq;
        };
    };

    /* --- shared fields (and owner_key, above) --- */
    /* Owner id, remote chain: see GS_X_*. CAS by remote freers, adopters,
       and the owner. */
    _Atomic uint64_t xstate;
    /* Pending chains (pending.c). */
    _Atomic uint64_t pending[GS_PENDING_CHAINS];
    /* Set (under orphan_lock[cls]) while on the orphan list. */
    bool orphaned;
    /* Medium slabs, while orphaned (orphan_lock[cls]): free objects left
       committed, counted in the orphans' budget (heap.c, orphan_keep). */
    uint8_t orphan_free;
    /* Owner field, in the padding: objects [zero_from, capacity) hold
       only zero bytes — never handed out since the slab was formatted on
       memory without old bytes (gsi_slab_new) — so calloc need not clear
       them. capacity when unknown. Kept exact for the medium classes only,
       whose every hand-out goes through gsi_slab_pop_counted (dedicated
       caches stop at 32 KiB); the small fast path pops without it, so
       small slabs keep capacity. */
    uint16_t zero_from;
    /* Id of the heap that released it last: written by that owner before
       its release CAS, read by the next owner after its acquire CAS (a
       heap that adopts back its own slabs keeps them: heap.c, "Full
       slabs"). Here, in the padding of the last line, to keep the struct
       at three lines. */
    uint32_t released_by;
} __attribute__((aligned(64)));
_Static_assert(sizeof(struct gs_slab) == 192, "three cache lines");

/* GS_IN_PARKED: a medium slab on the full list whose `used` is a watch of
   1 (heap.c, "Full slabs"); its true count is its capacity. */
enum gs_slab_where {
    GS_IN_NONE = 0, GS_IN_ACTIVE, GS_IN_PARTIAL, GS_IN_WAITING, GS_IN_FULL, GS_IN_PARKED,
    GS_IN_KEPT
};

/*
 * A segment: 4 MiB aligned; slot 0 holds this header, slots 1..63 slabs.
 * All fields but the per-slab shared fields are protected by segment_lock.
 */
struct gs_segment {
    uint64_t magic;                      /* GS_SEGMENT_MAGIC */
    struct gs_segment *next, *prev;      /* all segments (segment_lock) */
    /* On the list of segments whose longest run of free slots is
       open_run slots (0: on none), and on the list of segments with dirty
       slots (segment_lock; segment.c, "room lists"). */
    struct gs_segment *open_next, *open_prev, *dirty_next, *dirty_prev;
    uint64_t seq; /* creation number: a newer segment has a larger one */
    uint8_t open_run;
    bool on_dirty_list;
    uint64_t free_slots;                 /* bit i: slot i unused */
    uint64_t dirty_slots;                /* bit i: unused but committed */
    uint64_t ready_slots;                /* bit i: part of a READY slab */
    /* bit i: unused and not dirty, but its madvise failed (locked pages),
       so it may still hold old bytes; a new slab there is not known zero. */
    uint64_t stale_slots;
    /* bit i: unused, given back by the empty-slab budget (trim_locked) at
       dirty_since[i] (segment.c, "Refaults"). */
    uint64_t trimmed_slots;
    /* bit i: a slab was made on slot i within a decay period of the
       budget giving it back (segment.c, "Refaults"). */
    uint64_t refault_slots;
    /* The id of the heap whose new slabs come from here first (0: none;
       gsi_slab_new). A wholly unused segment and the segments of an
       abandoned heap have none. */
    uint32_t affinity;
    uint64_t dirty_since[GS_SLOTS];      /* ns timestamp when it became unused
                                            (trimmed_slots: when given back) */
    struct gs_slab *slot_slab[GS_SLOTS]; /* slot -> slab metadata (first slot of a span) */
    bool fastmapped;                     /* slot_slab mirrored in gsi_fastmap */
    struct gs_slab slabs[GS_SLOTS];      /* metadata, indexed by first slot */
    /* Link arrays of the slabs whose class has them here (gsi_class_header_links),
       indexed by first slot: dense, so the lines every malloc and free
       read spread over the cache sets instead of piling up at the slabs'
       64 KiB-aligned starts. Row 0 (the header's own slot) is unused. */
    uint16_t slot_links[GS_SLOTS][GS_SLOT_LINK_BYTES / 2] __attribute__((aligned(64)));
};
_Static_assert(sizeof(struct gs_segment) <= GS_SLOT_SIZE, "the header fits slot 0");
#define GS_SEGMENT_MAGIC 0x6772616365736c62ull /* "graceslb" */

/* A large block: header at the start of its mapping (4 MiB aligned). */
struct gs_large {
    uint64_t magic;          /* GS_LARGE_MAGIC while live, 0 in the cache */
    size_t map_len;          /* bytes mapped */
    void *user;              /* pointer handed out */
    size_t usable;           /* bytes usable at user */
    _Atomic uint32_t state;  /* GS_LARGE_LIVE / _PENDING (gs_free_rcu) */
    uint64_t cookie;         /* pending: grace period it waits for */
    struct gs_large *next;   /* cache list / pending list */
    uint64_t cached_at;      /* ns, in the cache */
};
#define GS_LARGE_MAGIC 0x6c617267652d6773ull
#define GS_LARGE_LIVE 1u
#define GS_LARGE_PENDING 2u

struct gs_slab_list {
    struct gs_slab *first, *last;
    size_t count;
};

/*
 * A thread heap. Owned by one thread; never freed (pooled on thread exit so
 * ids stay unique among live heaps and late remote frees find memory).
 * Everything here is owner-only unless marked.
 */
struct gs_heap {
    /* malloc's fast path: the active slab by size (GS_DIRECT_ENTRIES: a
       copy of active[] by size, so that malloc needs no size-class lookup;
       kept by heap_set_active). */
    struct gs_slab *direct[GS_DIRECT_ENTRIES];
    struct gs_slab *active[GS_NCLASSES];       /* never NULL: empty sentinel */
    uint32_t id;                               /* 1.. ; owner id in xstate */
    /* What slabs it owns store in owner_key. For the heap of a running
       thread, the thread pointer (%fs base): the free fast path compares it
       in one instruction, with no TLS variable to load. Unique among
       running threads, and a thread's slabs are all released at its exit
       (heap_abandon) before another thread can get its thread pointer.
       Otherwise (a heap made for a thread already exiting, a cache's
       detached heap, every heap under Valgrind, which wants the slow
       path) the heap's own address, which no thread pointer equals; and 1
       for gsi_empty_heap, which owns nothing. */
    uintptr_t key;
    /* The thread pointer of the thread it was made for (0: detached), kept
       whatever the key: a live heap with this thread's pointer that is not
       this thread's heap belonged to a thread that exited without
       abandoning it (abandon_dead_heaps, heap.c). heap_lock. */
    uintptr_t thread_ptr;
    bool live;                                 /* has a thread (heap_lock) */
    bool lost;                                 /* fork child: abandoned, thread gone */
    struct gs_slab_list partial[GS_NCLASSES];  /* owned, with free objects */
    /* Owned and empty, kept for reuse (kept_empty; refilled from after
       partial: partly used slabs first). Apart from partial so that the
       partial slab looked at longest ago is the list's last (heap.c,
       poll_partial). */
    struct gs_slab_list kept[GS_NCLASSES];
    struct gs_slab_list waiting[GS_NCLASSES];  /* owned, pending objects only */
    /* Used-up slabs kept owned instead of released, while keep_full (heap.c,
       "Full slabs"): nothing free as far as the owner knows. */
    struct gs_slab_list full[GS_NCLASSES];
    bool keep_full;
    uint32_t self_adopts;                      /* own released slabs adopted back */
    /* New slabs asked for; from GS_HEAP_CLAIM_AFTER on, they come from
       segments this heap claims (segment.c, place_locked). */
    uint32_t slabs_made;
    unsigned poll_cls;                         /* full_poll_other's turn */
    unsigned partial_poll_cls;                 /* poll_partial_other's turn */
    /* Bit c set while partial[c] has a slab (set by make_partial, cleared
       when unlink_owned takes its last): poll_partial_other's map. */
    uint64_t partial_classes[(GS_NCLASSES + 63) / 64];
    size_t empty_bytes;                        /* empty slabs kept on partial lists */
    /* Per class: slabs it may still keep when they empty, one earned per
       slab it made active (heap.c, gsi_heap_slab_empty). Owner only. */
    uint16_t keep_credit[GS_NCLASSES];
    uint64_t decay_ns;                         /* last decay pass; 0: no medium slab nor kept one yet (decay.c) */
    uint32_t decay_pass;                       /* passes made (decay.c) */
    uint32_t keep_seq;                         /* medium slabs kept, ever (heap.c) */
    /* Per class, the class's demand count (heap.c, class_demand) this
       heap saw last, and the sheds it may still make since then. */
    uint32_t demand_seen[GS_NCLASSES];
    uint16_t shed_credit[GS_NCLASSES];
    /* This thread's latest remote frees into one slab another heap owns:
       chained through their REMOTE links but not yet pushed onto the
       slab's remote chain (slab.c, gsi_remote_flush). Owner thread only,
       and a fork child for the heaps of threads that did not survive. */
    struct gs_slab *rbatch_slab;
    uint64_t rbatch;                           /* GS_RB_MAKE(head, tail, count) */
    /* 1 while the owner thread is inside a deferred-free operation (a push
       or a reclaim of pending objects); fork waits for 0 (pending.c). */
    _Atomic int defer_busy;
    struct gs_heap *next_all;                  /* all heaps (heap_lock) */
    struct gs_heap *next_pool;                 /* free pool (heap_lock) */
    /* Statistics: written by the owner (relaxed), read by gs_stats_get. */
    _Atomic int64_t pending_objects[GS_NCLASSES];
    _Atomic uint64_t reclaimed_objects;
};

/* ---------------------------------------------------------------------
 * size_class.c
 * --------------------------------------------------------------------- */
struct gs_class_info {
    uint32_t size;       /* object size */
    uint32_t capacity;   /* objects per slab */
    uint32_t link_bytes; /* bytes before the first object (at colour 0); 0:
                            the links are in the segment header
                            (gsi_class_header_links) */
    uint32_t colors;     /* link-array offsets, 64 B apart, that fit (gsi_class_color) */
    uint8_t span;        /* slots per slab */
    uint64_t inverse;    /* inverse of the odd part of size, mod 2^64 */
    uint8_t shift;       /* size == odd part << shift */
    /* direct[] entries (malloc's size -> slab array, heap.c) that name this
       class: [direct_first, direct_end) */
    uint16_t direct_first, direct_end;
};
extern struct gs_class_info gsi_classes[GS_NCLASSES];
/* The class keeps its links in the segment header (slot_links), and the
   whole span holds objects (size_class.c, "Where the links live"). */
GS_INLINE bool gsi_class_header_links(const struct gs_class_info *ci)
{
    return ci->link_bytes == 0;
}
/* Class of a size <= 1024, indexed by (size + 15) >> 4. Filled once at
   initialisation; read by the malloc fast path before it knows whether the
   thread (or the process) is initialised, so entries are relaxed atomics
   (plain byte loads): a value read too early is harmless, because an
   uninitialised thread's heap has only empty slabs and its slow path
   computes the class again after initialising. */
/* 128 entries for 65 used, and the index masked: a no-op for sizes up to
   1024, but gcc at -O0 then sees no out-of-bounds read on the paths it
   does not remove (a constant size above 1024 behind a test; its
   -Wstringop-overflow false positive in debug builds). */
#define GS_SMALL_CLASS_ENTRIES 128
extern _Atomic uint8_t gsi_class_of_small[GS_SMALL_CLASS_ENTRIES];
GS_INLINE unsigned gsi_small_class(size_t size)
{
    return atomic_load_explicit(
        &gsi_class_of_small[((size + 15) >> 4) & (GS_SMALL_CLASS_ENTRIES - 1)],
        memory_order_relaxed);
}
void gsi_classes_init(void);
/* Layout of the slab of class ci at base, for a class without
   gsi_class_header_links: link array at base + *link_off, first object at
   base + *start_off (see gsi_class_color in size_class.c). */
void gsi_class_color(const struct gs_class_info *ci, const void *base, size_t *link_off,
                     size_t *start_off);
unsigned gsi_class_slow(size_t size); /* any size <= GS_SMALL_MAX */
/* Slots of a medium class's slab (size above GS_DIRECT_MAX): one of two
   spans, so that an emptied slab can serve other classes (size_class.c). */
unsigned gsi_medium_span(size_t size);
#define GS_MEDIUM_MAX_OBJECTS 16 /* a bit each in decay.c's masks */
/* Class of 1024 < size <= GS_SMALL_MAX: 8 classes per doubling, so the top
   bit of size - 1 and the three below it, rounded up. */
GS_INLINE unsigned gsi_class_above_1k(size_t size)
{
    size_t v = size - 1;
    unsigned top = 63 - (unsigned)__builtin_clzl(v); /* 2^top <= v */
    unsigned sub = (unsigned)(v >> (top - 3)) & 7;   /* eighths above 2^top */
    /* Classes for (2^top, 2^(top+1)] start at 8 + 8 * (top - 7). */
    return 8 * (top - 6) + sub;
}
GS_INLINE unsigned gsi_size_class(size_t size)
{
    if (GS_LIKELY(size <= 1024))
        return gsi_small_class(size);
    return gsi_class_slow(size);
}

/* Smallest class whose objects are all aligned to `align` (a power of two)
   and hold size; -1 if none.
   It is the class of size rounded up to a multiple of align: classes in
   (b, 2b] are every multiple of b/8 there, so a multiple of align is itself
   a class when align > b/8, and any class there is a multiple of align when
   align <= b/8 (both powers of two); the same holds for 16..128 in steps
   of 16. A slab's first object is aligned to its class's natural
   alignment (the size's lowest set bit, up to a slot; gsi_class_color) and
   the others follow at multiples of the size. tests/unit/test_size_class
   checks every size against a search of the class table. */
/* size rounded up to a multiple of align (a power of two), at least align:
   the class of that size is the smallest whose objects are aligned to
   align (see gsi_class_aligned). No overflow for size and align up to
   GS_SMALL_MAX. */
GS_INLINE size_t gsi_aligned_size(size_t size, size_t align)
{
    return ((size < align ? align : size) + align - 1) & ~(align - 1);
}
GS_INLINE int gsi_class_aligned(size_t size, size_t align)
{
    if (size > GS_SMALL_MAX || align > GS_SLOT_SIZE)
        return -1;
    size_t want = gsi_aligned_size(size, align);
    if (want > GS_SMALL_MAX)
        return -1;
    return (int)(want <= 1024 ? gsi_small_class(want) : gsi_class_above_1k(want));
}

/* ---------------------------------------------------------------------
 * os.c: mmap, madvise, the segment map, time.
 * --------------------------------------------------------------------- */
/* One byte per 4 MiB unit of address space: 0 foreign, GS_MAP_SMALL for a
   segment, GS_MAP_LARGE + k for a large mapping whose start is k units back
   (k capped at GS_MAP_FAR; beyond it, walk back). Written under the lock of
   whoever maps the unit; read racily by free (a byte is atomic; a unit's
   byte changes only while no live pointer into it exists).
   Two levels, so that the map takes address space only where graceslab
   maps (a flat map was 32 MiB of it, which counts against RLIMIT_AS and a
   strict overcommit limit): gsi_segmap_top has one entry per 64 GiB
   region, NULL (foreign) or a 16 KiB leaf of bytes, mapped by the OS
   layer before graceslab maps anything in the region and never unmapped. */
#define GS_MAP_LEAF_SHIFT 36 /* 64 GiB per leaf */
#define GS_MAP_LEAF_UNITS ((size_t)1 << (GS_MAP_LEAF_SHIFT - GS_SEGMENT_SHIFT))
extern _Atomic(_Atomic uint8_t *) gsi_segmap_top[(size_t)1 << (GS_ADDR_BITS - GS_MAP_LEAF_SHIFT)];
#define GS_MAP_SMALL 1
#define GS_MAP_LARGE 2
#define GS_MAP_FAR   255

/* The leaf holding 4 MiB unit u (an address >> GS_SEGMENT_SHIFT, below
   2^GS_ADDR_BITS), or NULL. Acquire pairs with the release that publishes
   a leaf (os.c, map_reserve): its zero bytes are seen as such. */
GS_INLINE _Atomic uint8_t *gsi_map_leaf(uintptr_t u)
{
    /* The mask is a no-op for u below 2^GS_ADDR_BITS, as for
       gsi_small_class: no -O0 false positive on a caller's constant. */
    size_t top = (u >> (GS_MAP_LEAF_SHIFT - GS_SEGMENT_SHIFT)) &
                 (((size_t)1 << (GS_ADDR_BITS - GS_MAP_LEAF_SHIFT)) - 1);
    return atomic_load_explicit(&gsi_segmap_top[top], memory_order_acquire);
}

/* The byte of unit u. */
GS_INLINE unsigned gsi_map_unit(uintptr_t u)
{
    _Atomic uint8_t *leaf = gsi_map_leaf(u);
    if (!leaf)
        return 0;
    return atomic_load_explicit(&leaf[u & (GS_MAP_LEAF_UNITS - 1)], memory_order_relaxed);
}

GS_INLINE unsigned gsi_map_kind(uintptr_t a)
{
    if (GS_UNLIKELY(a >> GS_ADDR_BITS))
        return 0;
    return gsi_map_unit(a >> GS_SEGMENT_SHIFT);
}

void *gsi_os_map_aligned(size_t size, size_t align); /* NULL on failure */
void gsi_os_unmap(void *p, size_t size);
bool gsi_os_decommit(void *p, size_t size);           /* MADV_DONTNEED; false: failed (locked pages) */
extern _Atomic size_t gsi_os_decommit_calls;         /* madvise calls it made (tests) */
void gsi_os_populate(void *p, size_t size);           /* MADV_POPULATE_WRITE, where the kernel has it */
/* mincore; page-aligned p. Where mincore fails, all resident or none,
   as the caller says. */
size_t gsi_os_resident_bytes(void *p, size_t size, bool unknown_resident);
/* 0, or mremap's error (errno itself is preserved). */
int gsi_os_remap(void *old, size_t old_len, size_t new_len, void *fixed_new);
/* Marks the units of [start, start+len), a range gsi_os_map_aligned or
   gsi_os_remap gave (so their map leaves exist). */
void gsi_map_set(void *start, size_t len, unsigned kind_first);
void gsi_map_clear(void *start, size_t len);
uint64_t gsi_now_ns(void);
/* The clock as of the last timer tick (at most 10 ms old): 3 ns a read
   here, against 25 for gsi_now_ns. For periods of 100 ms and more. */
uint64_t gsi_now_coarse_ns(void);
extern _Atomic size_t gsi_os_mapped_bytes;

/* ---------------------------------------------------------------------
 * segment.c: slabs from segments; empty slabs back to the OS.
 * --------------------------------------------------------------------- */
/* A formatted slab of class cls, unowned, not on any list; NULL if the OS
   refuses memory. `populate`: the caller has just used up a whole slab of
   the class, so this one will likely fill too, and slots it takes back
   from a purge are paged in at once (objects up to a page; segment.c).
   `affinity`: a heap id (0: none) whose segments the slab is placed in,
   claiming one if it has none with room (segment.c). */
struct gs_slab *gsi_slab_new(unsigned cls, bool populate, uint32_t affinity);
/* A heap stops claiming segments: those it claimed are anyone's again. */
void gsi_segments_disown(uint32_t affinity);
/* Returns an empty slab (used == 0, no pending) to its segment. */
void gsi_slab_retire(struct gs_slab *s);
/* Gives committed empty slabs older than the purge delay back to the OS
   (force: all of them). Returns bytes decommitted. */
size_t gsi_segments_purge(bool force);
/* Calls fn(slab, arg) for every formatted slab, under segment_lock. */
void gsi_segments_foreach(void (*fn)(struct gs_slab *, void *), void *arg);
void gsi_segments_lock(void);
void gsi_segments_unlock(void);
void gsi_segments_atfork_child(void);
size_t gsi_segments_count(void);
/* A large block's user pointer stops being live (left) and/or becomes live
   (joined; either may be NULL): while such a pointer lives, no segment owns
   the fast-map entry a free of it reads (segment.c). Called when a pointer
   is handed out, freed, or moved by realloc. */
void gsi_fastmap_large(const void *left, const void *joined);
/* Copies up to max live segments to out (tests); returns how many live. */
size_t gsi_segments_list(struct gs_segment **out, size_t max);
/* Tests: the number of segments on the open lists whose longest run of
   free slots is min_run or more, or -1 unless those lists hold exactly
   the segments with a free slot, each on the list of its longest run,
   and the dirty list exactly those with a dirty slot, newest first. */
long gsi_segments_open_check(unsigned min_run);
/* Tests: segments with no free slot whose every slab has objects in use
   or is owned by the heap numbered owner. */
long gsi_segments_full_in_use(uint32_t owner);
size_t gsi_segments_decommitted(void); /* bytes of unused slots given back */
size_t gsi_segments_dirty_bytes(void);  /* bytes of unused slots still committed */
size_t gsi_segments_given_back(void);   /* bytes of dirty slots decommitted so far */
/* What dirty slots and the heaps' shared keep may hold together:
   GRACESLAB_EMPTY_CACHE_MB, or half the committed bytes of the slabs in
   use (decayed medium objects left out) if more. */
size_t gsi_segments_empty_budget(void);
/* What refaults add to it, less the heaps' own keeps (segment.c,
   "Refaults"). */
size_t gsi_segments_budget_boost(void);
/* calloc cleared a block of s: the pages it touched say nothing of the
   program's use, so s no longer counts as a refault. */
void gsi_slab_cleared(struct gs_slab *s);
/* Decommits dirty slots past the budget, which fell (a heap's own keep
   grew while there is a boost). */
void gsi_segments_trim(void);
size_t gsi_heap_shared_kept_bytes(void); /* empty slabs heaps keep from the shared budget */
size_t gsi_heap_own_kept_bytes(void);    /* empty slabs heaps keep of their own, together */
/* decay.c: the owner gives back the pages of medium objects that stayed
   free since its last pass (at most one pass per GRACESLAB_DECAY_MS);
   called from h's allocation slow path for class cls, and when a free
   empties h's slab of class cls. */
void gsi_heap_decay(struct gs_heap *h, unsigned cls);
void gsi_heap_decay_start(struct gs_heap *h); /* the clock, if not started yet */
void gsi_heap_retire_idle_kept(struct gs_heap *h); /* heap.c; at a decay pass */
size_t gsi_heap_decay_now(struct gs_heap *h); /* malloc_trim: all free medium objects */
/* malloc_trim: h gives back the free pages every orphan keeps committed
   (heap.c, orphan_evict); returns the bytes. */
size_t gsi_heap_trim_orphans(struct gs_heap *h);
/* The owner of s, a slab it is about to give up (heap.c, orphan_keep):
   its free medium objects that still have pages, one bit each (0 for a
   small slab, and under memcheck); and giving those of mask back. */
uint32_t gsi_slab_committed_free(struct gs_slab *s);
void gsi_slab_decommit_free(struct gs_slab *s, uint32_t mask);
/* Bytes of free medium objects whose pages decay gave back (statistics:
   not committed). */
extern _Atomic int64_t gsi_decayed_bytes; /* (signed: see decay.c) */
void gsi_decay_reused(struct gs_slab *s, uint64_t idx);
/* The slab leaves its heap for good (retire): its decayed objects count
   as committed again, as the rest of the slab's slots (an upper bound
   until a purge decommits them). */
void gsi_decay_forget(struct gs_slab *s);

/* The fast map: the free fast path's way from a pointer to its slab
   metadata, one load and no branch. One entry per 64 KiB slot of address
   space modulo 2^(GS_FASTMAP_BITS + GS_SLOT_SHIFT) (64 GiB); an entry holds
   the slab's metadata address as an offset from gsi_unused_slab, so a zero
   entry (never written: foreign memory) names gsi_unused_slab, whose owner
   never matches a heap. It is a hint, not an authority: free accepts a
   pointer only if the slab named is the thread's own and the pointer is
   exactly one of its allocated objects, so a pointer that aliases another
   segment's entry, or an entry left stale, just takes the slow path (which
   asks the segment map). Entries are written under segment_lock (segment.c);
   entries only ever name metadata inside a mapped segment or the
   sentinel: a segment's entries are cleared before it is unmapped, and
   while a segment shares its entries with another live segment or a live
   large block (addresses a multiple of 64 GiB apart) nobody owns them, so
   no valid free can read metadata of a segment being unmapped (segment.c,
   "Sharing"; docs/design.md, section 1).
   The sentinel and the entries are one object, the sentinel first, so the
   one address free computes is both the base the entry is added to and
   the base it is indexed from (below). */
#ifndef GS_FASTMAP_BITS /* smaller in the alias test build (tests/unit) */
#define GS_FASTMAP_BITS 20
#endif
struct gs_fastmap {
    struct gs_slab unused; /* gsi_unused_slab */
    _Atomic uintptr_t entry[(size_t)1 << GS_FASTMAP_BITS];
};
extern struct gs_fastmap gsi_fastmap;
/* The metadata of every unused slot: kind UNUSED, so a free into it is
   reported, and an owner that never matches. */
#define gsi_unused_slab (gsi_fastmap.unused)
GS_INLINE struct gs_slab *gsi_slab_hint(const void *p)
{
    size_t i = ((uintptr_t)p >> GS_SLOT_SHIFT) & (((size_t)1 << GS_FASTMAP_BITS) - 1);
    uintptr_t s = (uintptr_t)&gsi_unused_slab;
#if GS_FAST_ASM
    /* Entry and base in one `add` with a memory operand: gcc and clang
       load a relaxed atomic into a register of its own first, one
       instruction more in free (26 -> 25). An aligned 8-byte load is
       single-copy atomic on x86_64, as the relaxed load it replaces; the
       "m" operand says which entry the asm reads. Not under
       ThreadSanitizer, which cannot see a read inside asm. */
    __asm__("addq %c[off](%[s],%[i],8), %[s]"
            : [s] "+r"(s)
            : [off] "i"(offsetof(struct gs_fastmap, entry)), [i] "r"(i),
              "m"(gsi_fastmap.entry[i]));
#else
    s += atomic_load_explicit(&gsi_fastmap.entry[i], memory_order_relaxed);
#endif
    return (struct gs_slab *)s;
}

/* The segment of slab s (its metadata sits in the segment's header), and
   in *first the slot s begins at. */
GS_INLINE struct gs_segment *gsi_slab_segment(const struct gs_slab *s, unsigned *first)
{
    struct gs_segment *seg = (struct gs_segment *)((uintptr_t)s & ~GS_SEGMENT_MASK);
    *first = (unsigned)(s - seg->slabs);
    return seg;
}

/* The slab metadata for p, which gsi_map_kind() says is in a segment (the
   slow paths' way; the free fast path uses gsi_slab_hint). */
GS_INLINE struct gs_slab *gsi_slab_of(const void *p)
{
    struct gs_segment *seg = (struct gs_segment *)((uintptr_t)p & ~GS_SEGMENT_MASK);
    return seg->slot_slab[((uintptr_t)p >> GS_SLOT_SHIFT) & (GS_SLOTS - 1)];
}

/* ---------------------------------------------------------------------
 * slab.c: objects in a slab; remote frees; ownership.
 * --------------------------------------------------------------------- */
/* Index of p in s, or -1 if p is not the start of one of its objects.
   Exact division without a remainder check: with obj_size = odd << shift,
   rotating (off * odd^-1 mod 2^64) right by shift gives off / obj_size when
   obj_size divides off, and a value above 2^64 / obj_size (so above any
   capacity) when it does not (the divisibility test of Hacker's Delight
   10-17). One compare then rejects interior pointers, the slab's tail and
   addresses below start (their offset wraps to a huge value). */
GS_INLINE long gsi_slab_index(const struct gs_slab *s, const void *p)
{
    uint64_t q = ((uintptr_t)p - (uintptr_t)s->start) * s->inverse;
    q = (q >> s->shift) | (q << ((64 - s->shift) & 63));
    uint64_t limit = s->limit;
    if (limit > GS_MAX_OBJECTS)
        __builtin_unreachable(); /* so callers' idx >= 0 tests fold away */
    if (GS_UNLIKELY(q >= limit))
        return -1;
    return (long)q;
}
GS_INLINE uint16_t gsi_link_load(const struct gs_slab *s, size_t idx)
{
    return __atomic_load_n(&s->link[idx], __ATOMIC_RELAXED);
}
/* Owner, free fast path: is object idx allocated? On x86_64 one compare
   with memory: gcc loads a relaxed atomic into a register before comparing
   it, and a plain read lets it share the link's address with the push's
   store through an extra `lea`; either way one instruction more in free.
   The asm reads the link array (its memory operand says so, and `volatile`
   keeps it after the owner and index checks). Not under ThreadSanitizer,
   which cannot see a read inside asm. */
GS_INLINE bool gsi_link_allocated_own(const struct gs_slab *s, size_t idx)
{
#if GS_FAST_ASM
    bool yes;
    __asm__ volatile("cmpw $-1, (%1,%2,2)"
                     : "=@ccz"(yes)
                     : "r"(s->link), "r"(idx), "m"(*(const uint16_t(*)[GS_MAX_OBJECTS])s->link));
    return yes;
#else
    return gsi_link_load(s, idx) == GS_LINK_ALLOCATED;
#endif
}
GS_INLINE void gsi_link_store(struct gs_slab *s, size_t idx, uint16_t v)
{
    __atomic_store_n(&s->link[idx], v, __ATOMIC_RELAXED);
}
/* Owner: the local free list head is idx (free_ptr follows it). */
GS_INLINE void gsi_slab_set_head(struct gs_slab *s, size_t idx)
{
    s->free_head = idx;
    s->free_ptr = s->start + (size_t)idx * s->obj_size;
}
/* Owner: pops the local free list head (not empty) and marks it
   allocated. It does not count the object in `used`: the heap's active
   slab is charged in advance (see struct gs_slab); other callers count. */
GS_INLINE void *gsi_slab_pop(struct gs_slab *s)
{
    char *p = s->free_ptr;
#if defined(__x86_64__)
    /* p in the return register from the start: GCC otherwise loads it
       into another one and copies it at the end, one instruction of
       malloc's fast path (20 -> 19). */
    __asm__("" : "+a"(p));
#endif
    uint64_t idx = s->free_head;
    gsi_slab_set_head(s, gsi_link_load(s, idx));
    gsi_link_store(s, idx, GS_LINK_ALLOCATED);
    return p;
}
/* Owner: pushes object idx at p onto the local free list. */
GS_INLINE void gsi_slab_push(struct gs_slab *s, uint32_t idx, void *p)
{
    gsi_link_store(s, idx, (uint16_t)s->free_head);
    s->free_head = idx;
    s->free_ptr = p;
}
/* Owner: pops, counting the object committed again if decay gave its
   pages back (the paths that may pop medium objects; small classes never
   decay, and the small fast path pops with gsi_slab_pop). */
GS_INLINE void *gsi_slab_pop_counted(struct gs_slab *s)
{
    uint64_t idx = s->free_head;
    void *p = gsi_slab_pop(s);
    if (GS_UNLIKELY(s->decayed))
        gsi_decay_reused(s, idx);
    if (idx >= s->zero_from)
        s->zero_from = (uint16_t)(idx + 1); /* handed out: no longer known zero */
    return p;
}
/* Owner: whether the object gsi_slab_pop_counted() would pop next holds
   only zero bytes (see zero_from). Never under memcheck, which then sees
   calloc clear the block and so knows its bytes defined. */
GS_INLINE bool gsi_slab_next_is_zero(const struct gs_slab *s)
{
    return !gsi_valgrind && s->free_head != GS_LINK_END && s->free_head >= s->zero_from;
}
void gsi_slab_format(struct gs_slab *s, char *base, unsigned cls);
/* Owner: an empty medium slab of its heap, off every list, made a slab of
   class cls (of the same span) in place, still owned (heap.c, "Medium
   reuse"). */
void gsi_slab_reformat(struct gs_slab *s, unsigned cls);
/* The active slab's advance charge: no run of frees reaches it (2^62). */
#define GS_ACTIVE_CHARGE ((uint64_t)1 << 62)
/* Owner: the exact `used` of s from its lists (bump - |local list|). */
uint64_t gsi_slab_recount(const struct gs_slab *s);
/* Owner: moves up to `want` never-used objects onto the local list. */
uint32_t gsi_slab_extend(struct gs_slab *s, uint32_t want);
/* Owner: moves the remote chain onto the local list; returns objects moved. */
uint32_t gsi_slab_collect(struct gs_slab *s);
/* Any thread but the owner: frees p (index idx) into s. Adopts s into heap
   h if it is ownerless (then frees locally and returns true). */
void gsi_slab_free_remote(struct gs_heap *h, struct gs_slab *s, uint32_t idx, const char *call);
/* Remote frees are pushed GS_REMOTE_BATCH at a time (one CAS on the
   slab's xstate per batch), or when the thread frees into another slab,
   exits or flushes. */
#define GS_REMOTE_BATCH 64
#define GS_RB_MAKE(head, tail, count)                                          \
    (((uint64_t)(head) << 32) | ((uint64_t)(tail) << 16) | (uint64_t)(count))
#define GS_RB_HEAD(b)  ((uint32_t)((b) >> 32) & 0xFFFFu)
#define GS_RB_TAIL(b)  ((uint32_t)((b) >> 16) & 0xFFFFu)
#define GS_RB_COUNT(b) ((uint32_t)(b) & 0xFFFFu)
/* Pushes h's batch of remote frees, if any (h's thread only). */
void gsi_remote_flush(struct gs_heap *h);
/* Owner: gives s up if it has no remote frees in flight; true if done. */
bool gsi_slab_release(struct gs_heap *h, struct gs_slab *s);
/* The same, recording released_by as the releaser (0: nobody's, so that
   no heap counts taking it back as adopting back its own). */
bool gsi_slab_release_as(struct gs_heap *h, struct gs_slab *s, uint32_t released_by);
/* Takes an ownerless slab; true on success (acquire). */
bool gsi_slab_adopt(struct gs_heap *h, struct gs_slab *s);
/* The slab and index of the small block p (in a segment), or aborts naming
   call: an unused slot, or not the start of an object. */
struct gs_slab *gsi_small_block(const void *p, uint32_t *idx, const char *call);
/* Aborts with the right message for a link value that is not ALLOCATED. */
_Noreturn void gsi_bad_free(const char *call, const void *p, uint16_t link);

/* ---------------------------------------------------------------------
 * heap.c: thread heaps, refill, abandonment, fork.
 * --------------------------------------------------------------------- */
/* The thread's heap as the fast paths see it, and as it really is. They
   differ only under Valgrind (see vg.h), where the fast-path heap stays the
   empty heap so that every call reaches the slow paths. */
extern __thread struct gs_heap *gsi_tls_heap;
/* The calling thread's key (gs_heap.key): its thread pointer. */
GS_INLINE uintptr_t gsi_thread_key(void)
{
    return (uintptr_t)__builtin_thread_pointer();
}
extern __thread struct gs_heap *gsi_tls_mine;
extern struct gs_heap gsi_empty_heap;
extern struct gs_slab gsi_empty_slab;
struct gs_heap *gsi_heap_get(void);   /* the calling thread's heap, created on demand (NULL on OOM) */
/* Owner: retires the empty slabs h keeps for reuse; returns their bytes. */
size_t gsi_heap_trim(struct gs_heap *h);
/* Slow path of malloc for a small class: refills and allocates. */
/* zeroed (may be NULL): set to whether the block holds only zero bytes
   (gsi_slab_next_is_zero). */
void *gsi_heap_alloc_slow(struct gs_heap *h, unsigned cls, size_t size, bool *zeroed);
/* Owner frees into its own slab (fast path body, also used by slow paths). */
void gsi_heap_free_local(struct gs_heap *h, struct gs_slab *s, uint32_t idx, const char *call);
/* The owner's slab just became empty (used == 0). */
void gsi_heap_slab_empty(struct gs_heap *h, struct gs_slab *s);
/* The free fast path emptied s, whose owner key is this thread's, by
   freeing p (passed first so that the fast path keeps p where it arrived
   and needs no register move for this cold call). */
void gsi_heap_free_emptied(const void *p, struct gs_slab *s);
/* A slab just adopted by h through a free: put it on h's lists. */
void gsi_heap_take_adopted(struct gs_heap *h, struct gs_slab *s);
/* Orphan lists: ownerless slabs that still hold free or pending objects. */
void gsi_orphan_push(struct gs_slab *s, uint32_t committed_free);
/* Bytes of the free medium objects orphans keep committed (heap.c,
   orphan_keep; relaxed, read by the budget's check and tests). */
extern _Atomic size_t gsi_orphan_free_bytes;
void gsi_orphan_remove(struct gs_slab *s);
void gsi_heaps_foreach(void (*fn)(struct gs_heap *, void *), void *arg);
void gsi_heap_init_once(void);
struct gs_heap *gsi_heap_detached(void);
void gsi_heap_detached_put(struct gs_heap *h);
void gsi_heap_list_remove(struct gs_slab_list *l, struct gs_slab *s);
void gsi_heap_list_push(struct gs_slab_list *l, struct gs_slab *s);

/* ---------------------------------------------------------------------
 * large.c: blocks above GS_SMALL_MAX, or aligned beyond what classes give.
 * --------------------------------------------------------------------- */
void *gsi_large_alloc(size_t size, size_t align, bool zero);
void gsi_large_free(struct gs_large *b, const char *call);
void *gsi_large_realloc(struct gs_large *b, size_t size);
/* The header of the large block containing p, or NULL if p is not inside
   a live large block. */
struct gs_large *gsi_large_of(const void *p);
/* Committed large-block bytes not in use: the cache, and the slack kept
   mapped past the usable end of live blocks. */
size_t gsi_large_cached_bytes(void);
/* Unmaps cached blocks older than a second, or all (force); returns bytes. */
size_t gsi_large_trim(bool force);
/* A dedicated cache's lock (cache.c), on the list of locks fork takes
   (heap.c), so a fork never catches a cache's work half done. */
struct gs_cache_lock {
    pthread_mutex_t mutex;
    struct gs_cache_lock *next, *prev; /* heap.c's list */
};
void gsi_cache_lock_register(struct gs_cache_lock *l);
void gsi_cache_lock_unregister(struct gs_cache_lock *l);
void gsi_large_atfork_prepare(void);
void gsi_large_atfork_parent(void);
void gsi_large_atfork_child(void);

/* ---------------------------------------------------------------------
 * malloc.c: entry points; shared helpers.
 * --------------------------------------------------------------------- */
void *gsi_malloc_aligned(size_t size, size_t align);
/* The OS refused memory: reclaim what can be reclaimed, say whether a retry
   is worth it (pending.c). */
bool gsi_oom_reclaim(void);

/* ---------------------------------------------------------------------
 * pending.c: gs_free_rcu and the reclaim of pending objects.
 * --------------------------------------------------------------------- */
void gsi_free_rcu(void *p, const char *call);
/* Owner: done pending chains of s onto the local list; objects moved. */
uint32_t gsi_pending_reclaim_local(struct gs_slab *s);
bool gsi_slab_has_pending(const struct gs_slab *s);
uint64_t gsi_slab_pending_cookie(const struct gs_slab *s);
/* Reclaims every done pending object of every slab and large block;
   returns bytes made reusable, and how many objects are still pending. */
size_t gsi_pending_sweep(size_t *still_pending);
/* Returns once every sweep running when it was called has finished. */
void gsi_pending_sweeps_quiesce(void);
/* Refill, before mapping a new slab of class cls: if at least
   GRACESLAB_PENDING_EXPEDITE_KB of that class is pending (any thread's
   deferrals), waits for a grace period and sweeps (outside a reader only);
   true if that made memory reusable (the orphan list may have slabs). */
bool gsi_pending_reclaim_class(unsigned cls);
/* Owner: does h hold enough slabs of class cls waiting for a grace period
   (GRACESLAB_PENDING_EXPEDITE_KB) that refill waits for one rather than
   map a new slab, and gs_free_rcu adopts no more? */
bool gsi_heap_pending_worth_waiting(struct gs_heap *h, unsigned cls);
/* GRACESLAB_PENDING_EXPEDITE_KB in bytes: the pending memory past which an
   allocation waits for a grace period rather than map more. */
GS_INLINE size_t gsi_pending_expedite_bytes(void)
{
    return (size_t)gsi_option(GSI_OPT_PENDING_EXPEDITE_KB) << 10;
}
/* Past the pending bound inside a read-side section, an allocation cannot
   wait for the next grace period (it waits for the caller), but it can for
   the one in progress if that one started before the section did
   (gsi_gp_wait_in_reader): for at most this long. The pending memory of
   threads that allocate and defer inside sections is their allocation
   rate times the grace-period latency, and without the wait nothing
   slowed them when the latency grew (preempted readers on a busier
   machine): eight writers inside sections on two CPUs, three other
   processes taking the CPUs from half-way, peaked at 66 to 83 MiB; with
   it, 48 to 55 MiB. Bounded, because the section may hold a lock that a
   reader of that grace period wants. */
#define GS_READER_WAIT_NS 20000000u
/* A heap whose waiting slabs of a class add up to this much waits so
   even within the 100 ms back-off that follows a time-out: under load (two
   CPU-bound processes beside eight writers inside sections on 2 CPUs) the
   waits timed out every few 100 ms, and in the back-offs the writers mapped
   up to 393 slabs (25 MiB) in 100 ms. A program whose section holds a lock
   that a reader wants then pays a time-out per refill of the class, with
   this much memory waiting on it. */
#define GS_READER_WAIT_ALWAYS_BYTES ((size_t)1 << 20)
/* Makes sure the engine's lazy thread sweeps pending memory later. */
void gsi_pending_kick(void);
extern _Atomic bool gsi_pending_unarmed;
void gsi_pending_stats(struct gs_stats *st);
/* fork: wait until no deferred-free operation is half done (before any
   allocator lock is taken), then let them go again. */
void gsi_pending_fork_prepare(void);
void gsi_pending_fork_done(void);
/* Large allocation path: reclaim (and bound) pending large blocks. */
void gsi_pending_large_refill(void);
void gsi_heap_settle_adopted(struct gs_heap *h, struct gs_slab *s);
void gsi_heap_wait_pending(struct gs_heap *h, struct gs_slab *s);
void gsi_heap_slab_reclaimed(struct gs_heap *h, struct gs_slab *s);
/* A parked slab's true `used` back before anything else changes it. */
void gsi_heap_slab_unpark(struct gs_slab *s);
void gsi_heaps_pending(int64_t *per_class, uint64_t *reclaimed);
GS_INLINE bool gsi_heap_owns(const struct gs_heap *h, uint64_t xstate)
{
    return h && GS_X_OWNER(xstate) == h->id;
}

/* ---------------------------------------------------------------------
 * stats.c
 * --------------------------------------------------------------------- */
extern _Atomic size_t gsi_large_live_bytes;
/* Writes the GRACESLAB_STATS summary to stderr (write(2), no malloc). */
void gsi_stats_print(void);

#endif /* GS_ALLOC_INTERNAL_H */
