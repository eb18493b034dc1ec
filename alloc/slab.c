/*
 * Objects inside a slab, and who owns the slab.
 *
 * Every object has a 16-bit link in its slab's link array, in the segment
 * header or near the front of the slab (out of band: never inside the
 * object). The owner heap keeps a LIFO local
 * free list through the links; other threads free through the remote chain
 * (head and length in slab->xstate, lock-free push); gs_free_rcu() uses the
 * pending chains (pending.c). The link value says which state an object is
 * in (GS_LINK_* in internal.h), so a double free, a free after
 * gs_free_rcu() and an interior pointer are all caught exactly.
 *
 * Object states and who moves them:
 *   allocated --free by owner--------------------> local free   (owner, plain)
 *   allocated --free by other thread-------------> remote chain (CAS xstate)
 *   remote chain --collect by owner--------------> local free   (CAS xstate)
 *   allocated --gs_free_rcu, any thread----------> pending(cookie) (CAS chain)
 *   pending --grace period done, reclaim---------> local free or remote chain
 *   local free --malloc by owner-----------------> allocated    (owner, plain)
 *
 * Ownership: xstate's owner id changes only by CAS. Giving a slab up
 * (release) is a CAS with release ordering that succeeds only when the
 * remote chain is empty; taking it (adopt) is a CAS with acquire ordering,
 * so the adopter sees every owner-field write of the previous owner. The
 * link array is accessed with relaxed atomics: the owner's accesses are
 * plain loads and stores in the generated code, and remote writers publish
 * their link writes with the release CAS on xstate that the owner's
 * collecting CAS acquires.
 */
#include "alloc/internal.h"

#include <string.h>

/* The owner fields of a slab of class cls on the slots at base: geometry,
   an empty local list, every link unused. */
static void slab_layout(struct gs_slab *s, char *base, unsigned cls)
{
    const struct gs_class_info *ci = &gsi_classes[cls];
    /* memcheck: the slots may have held objects of another class, which
       it knows as freed blocks. */
    if (gsi_class_header_links(ci)) {
        struct gs_segment *seg = (struct gs_segment *)((uintptr_t)base & ~GS_SEGMENT_MASK);
        s->link = seg->slot_links[((uintptr_t)base >> GS_SLOT_SHIFT) & (GS_SLOTS - 1)];
        s->start = base;
    } else {
        size_t link_off, start_off;
        gsi_class_color(ci, base, &link_off, &start_off);
        GS_VG_ADDRESSABLE(base, start_off);
        s->link = (uint16_t *)(base + link_off);
        s->start = base + start_off;
    }
    s->free_head = GS_LINK_END;
    s->used = 0;
    s->obj_size = ci->size;
    s->capacity = ci->capacity;
    s->limit = ci->capacity;
    s->inverse = ci->inverse;
    s->shift = ci->shift;
    s->bump = 0;
    s->cls = (uint8_t)cls;
    s->span = ci->span;
    s->where = GS_IN_NONE;
    s->next = s->prev = NULL;
    s->orphan_next = s->orphan_prev = NULL;
    s->cache = NULL;
    s->typesafe = false;
    s->idle_free = 0;
    s->idle_pass = 0;
    s->decayed = 0;
    s->wait_cookie = 0;
    s->released_by = 0;
    s->orphaned = false;
    s->zero_from = (uint16_t)ci->capacity; /* gsi_slab_new knows better */
    /* Objects not linked yet: their links may hold whatever the slots held
       before (another class's objects, with any bytes, 0xFFFF included;
       in the header, the links of the slot's previous slab),
       and a free of such an object must not pass for a free of an
       allocated one. The sentinel after the last object: a pointer into
       the slab's tail computes index == capacity and finds a link that is
       never ALLOCATED. */
    _Static_assert(GS_LINK_UNUSED >> 8 == (GS_LINK_UNUSED & 0xFF) && GS_LINK_UNUSED > GS_LINK_END &&
                       !(GS_LINK_UNUSED & (GS_LINK_REMOTE | GS_LINK_PENDING)),
                   "UNUSED: a byte pattern, not a list, remote or pending value");
    memset(s->link, GS_LINK_UNUSED & 0xFF, (size_t)ci->capacity * sizeof *s->link);
    gsi_link_store(s, ci->capacity, GS_LINK_INVALID);
    /* memcheck: no object is addressable until it is handed out. */
    GS_VG_NOACCESS(s->start, (size_t)ci->capacity * ci->size);
}

void gsi_slab_format(struct gs_slab *s, char *base, unsigned cls)
{
    slab_layout(s, base, cls);
    atomic_store_explicit(&s->owner_key, 0, memory_order_relaxed);
    atomic_store_explicit(&s->xstate, GS_X_MAKE(0, GS_LINK_END, 0), memory_order_relaxed);
    for (int i = 0; i < GS_PENDING_CHAINS; i++)
        atomic_store_explicit(&s->pending[i], GS_P_MAKE(0, GS_LINK_END & 0xFFF, 0),
                              memory_order_relaxed);
}

void gsi_slab_reformat(struct gs_slab *s, unsigned cls)
{
    GS_ASSERT(s->used == 0 && s->where == GS_IN_NONE && !s->kept_empty && !s->orphaned &&
              !s->cache && s->span == gsi_classes[cls].span && !gsi_slab_has_pending(s));
    GS_ASSERT(GS_X_COUNT(atomic_load_explicit(&s->xstate, memory_order_relaxed)) == 0);
    unsigned first;
    struct gs_segment *seg = gsi_slab_segment(s, &first);
    /* Its decommitted pages read as zero, which serves any class; they
       count as committed again (an overstatement of committed_bytes until
       the new class's free objects decay). */
    gsi_decay_forget(s);
    /* Ownership, the (empty) remote chain and the (empty) pending chains
       stay as they are: a thread that frees one of the old objects again
       meets links that are not ALLOCATED and aborts, as it would have
       before. Under the segment lock, as gsi_slab_new formats: a sweep
       reads the class and size of slabs it holds chains of while holding
       it, after handing their objects to the owner, which may collect
       them and reformat the slab at once (a review: the pending count and
       gs_reclaim's bytes went to the new class); and fork's prepare takes
       it, so a fork child never finds a slab half laid out (a review: 20
       torn slabs in 12,000 forks, one handing out 40,960 bytes for
       malloc(49384)). */
    gsi_segments_lock();
    slab_layout(s, (char *)seg + (size_t)first * GS_SLOT_SIZE, cls);
    gsi_segments_unlock();
}

uint32_t gsi_slab_extend(struct gs_slab *s, uint32_t want)
{
    uint32_t n = s->capacity - s->bump;
    if (n > want)
        n = want;
    if (!n)
        return 0;
    uint32_t first = s->bump, last = first + n - 1;
    for (uint32_t i = first; i < last; i++)
        gsi_link_store(s, i, (uint16_t)(i + 1));
    gsi_link_store(s, last, (uint16_t)s->free_head);
    gsi_slab_set_head(s, first);
    s->bump += n;
    return n;
}

uint64_t gsi_slab_recount(const struct gs_slab *s)
{
    /* The list is acyclic, so the walk ends; the bound only keeps a racy
       reader (statistics) finite. */
    uint32_t n = 0;
    for (uint32_t i = s->free_head; i != GS_LINK_END && n < s->capacity; n++)
        i = gsi_link_load(s, i) & GS_LINK_INDEX;
    return n < s->bump ? s->bump - n : 0;
}

uint32_t gsi_slab_collect(struct gs_slab *s)
{
    uint64_t x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
    if (GS_X_COUNT(x) == 0)
        return 0;
    /* Take the whole chain, keep the owner. Acquire pairs with the release
       CAS of each remote freer in gsi_slab_free_remote(): the links of the
       chain were written before it. */
    while (!atomic_compare_exchange_weak_explicit(
        &s->xstate, &x, GS_X_MAKE(GS_X_OWNER(x), GS_LINK_END, 0), memory_order_acquire,
        memory_order_relaxed)) {
    }
    uint32_t n = GS_X_COUNT(x), head = GS_X_HEAD(x), i = head;
    for (uint32_t k = 1; k < n; k++) {
        uint16_t v = gsi_link_load(s, i);
        GS_ASSERT_EXPENSIVE((v & ~GS_LINK_INDEX) == GS_LINK_REMOTE);
        gsi_link_store(s, i, v & GS_LINK_INDEX);
        i = v & GS_LINK_INDEX;
    }
    GS_ASSERT_EXPENSIVE((gsi_link_load(s, i) & ~GS_LINK_INDEX) == GS_LINK_REMOTE);
    gsi_link_store(s, i, (uint16_t)s->free_head);
    gsi_slab_set_head(s, head);
    GS_ASSERT(s->used >= n);
    s->used -= n;
    return n;
}

struct gs_slab *gsi_small_block(const void *p, uint32_t *idx, const char *call)
{
    struct gs_slab *s = gsi_slab_of(p);
    if (GS_UNLIKELY(s->kind != GS_SLAB_SMALL))
        gsi_fatal(call, "invalid pointer (not allocated by graceslab, or already freed)", p);
    long i = gsi_slab_index(s, p);
    if (GS_UNLIKELY(i < 0))
        gsi_fatal(call, "invalid pointer (not a block start)", p);
    *idx = (uint32_t)i;
    return s;
}

_Noreturn void gsi_bad_free(const char *call, const void *p, uint16_t link)
{
    if (link == GS_LINK_INVALID)
        gsi_fatal(call, "invalid pointer (not a block start)", p);
    if (link == GS_LINK_UNUSED)
        gsi_fatal(call, "invalid pointer (never allocated)", p);
    if ((link & GS_LINK_PENDING) && link != GS_LINK_ALLOCATED)
        gsi_fatal(call, "object already freed with gs_free_rcu(), pending a grace period:", p);
    gsi_fatal(call, "double free of", p);
}

bool gsi_slab_adopt(struct gs_heap *h, struct gs_slab *s)
{
    uint64_t x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
    do {
        if (GS_X_OWNER(x) != 0)
            return false;
        /* Acquire pairs with the release CAS in gsi_slab_release() (or the
           segment lock that formatted the slab): the previous owner's list
           and counters are visible. The remote chain stays in place for
           gsi_slab_collect(). */
    } while (!atomic_compare_exchange_weak_explicit(
        &s->xstate, &x, GS_X_MAKE(h->id, GS_X_HEAD(x), GS_X_COUNT(x)), memory_order_acquire,
        memory_order_relaxed));
    /* Only compared against by the fast path of the thread owning h. */
    atomic_store_explicit(&s->owner_key, h->key, memory_order_relaxed);
    return true;
}

bool gsi_slab_release(struct gs_heap *h, struct gs_slab *s)
{
    return gsi_slab_release_as(h, s, h->id);
}

bool gsi_slab_release_as(struct gs_heap *h, struct gs_slab *s, uint32_t released_by)
{
    /* Clear the mirror first: once the CAS below succeeds, an adopter may
       store its own heap there, and ours must not overwrite it. */
    atomic_store_explicit(&s->owner_key, 0, memory_order_relaxed);
    uint64_t x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
    GS_ASSERT(GS_X_OWNER(x) == h->id);
    s->released_by = released_by; /* published by the CAS below */
    /* Release pairs with the acquire CAS of the next adopter. Fails when a
       remote free got in: the caller collects and retries. */
    if (GS_X_COUNT(x) == 0 &&
        atomic_compare_exchange_strong_explicit(&s->xstate, &x, GS_X_MAKE(0, GS_LINK_END, 0),
                                                memory_order_release, memory_order_relaxed))
        return true;
    atomic_store_explicit(&s->owner_key, h->key, memory_order_relaxed);
    return false;
}

/* Pushes the chain head..tail (n objects, REMOTE links, tail's next to be
   set here) onto s's remote chain. If s has no owner, h adopts it with the
   chain (h != NULL), and the objects become local frees. */
static void push_remote_chain(struct gs_heap *h, struct gs_slab *s, uint32_t head,
                              uint32_t tail, uint32_t n)
{
    uint64_t x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
    for (;;) {
        gsi_link_store(s, tail, (uint16_t)(GS_LINK_REMOTE | GS_X_HEAD(x)));
        if (GS_X_OWNER(x) == 0 && h) {
            /* Acquire: as in gsi_slab_adopt(); the chain is ours. */
            if (!atomic_compare_exchange_weak_explicit(
                    &s->xstate, &x, GS_X_MAKE(h->id, head, GS_X_COUNT(x) + n),
                    memory_order_acquire, memory_order_relaxed))
                continue;
            atomic_store_explicit(&s->owner_key, h->key, memory_order_relaxed);
            gsi_heap_take_adopted(h, s); /* collects the chain: used -= n */
            if (s->used == 0)
                gsi_heap_slab_empty(h, s);
            return;
        }
        /* Release: publishes the chain's links to the owner's acquire CAS
           in gsi_slab_collect(). */
        if (atomic_compare_exchange_weak_explicit(
                &s->xstate, &x, GS_X_MAKE(GS_X_OWNER(x), head, GS_X_COUNT(x) + n),
                memory_order_release, memory_order_relaxed))
            return;
    }
}

void gsi_remote_flush(struct gs_heap *h)
{
    uint64_t b = h->rbatch;
    if (!GS_RB_COUNT(b))
        return;
    /* Forget the batch before pushing it: a fork child (which flushes the
       batches of threads that did not survive) may then lose a batch caught
       in between, but never push one twice. The push's CAS is a release,
       so this store comes first. */
    __atomic_store_n(&h->rbatch, 0, __ATOMIC_RELAXED);
    push_remote_chain(h, h->rbatch_slab, GS_RB_HEAD(b), GS_RB_TAIL(b), GS_RB_COUNT(b));
}

/* A remote free into s, owned by another heap: claims the object and adds
   it to h's batch (see GS_REMOTE_BATCH). Measured on bench/prodcons: one
   CAS on the owner's xstate per free made the consumer and the producer
   fight over that cache line. */
static void free_remote_batched(struct gs_heap *h, struct gs_slab *s, uint32_t idx,
                                const char *call)
{
    uint64_t b = h->rbatch;
    uint32_t n = GS_RB_COUNT(b);
    uint16_t next = (uint16_t)(GS_LINK_REMOTE | (n ? GS_RB_HEAD(b) : GS_LINK_END));
    /* The state check and the claim are one CAS, so two threads freeing
       the same object cannot both succeed. */
    uint16_t expect = GS_LINK_ALLOCATED;
    if (!__atomic_compare_exchange_n(&s->link[idx], &expect, next, false, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        gsi_bad_free(call, s->start + (size_t)idx * s->obj_size, expect);
    h->rbatch_slab = s;
    /* Release: the claim and the slab come before the count that covers
       them (for a fork child reading the batch). */
    __atomic_store_n(&h->rbatch, n ? GS_RB_MAKE(idx, GS_RB_TAIL(b), n + 1) : GS_RB_MAKE(idx, idx, 1),
                     __ATOMIC_RELEASE);
    if (n + 1 >= GS_REMOTE_BATCH)
        gsi_remote_flush(h);
}

void gsi_slab_free_remote(struct gs_heap *h, struct gs_slab *s, uint32_t idx, const char *call)
{
    if (h && GS_RB_COUNT(h->rbatch) && h->rbatch_slab != s)
        gsi_remote_flush(h);
    const void *p = s->start + (size_t)idx * s->obj_size;
    uint64_t x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
    /* Not into a dedicated cache's slab: gs_cache_destroy() must see every
       free made before it, and it cannot flush other threads' batches. */
    if (h && GS_X_OWNER(x) != 0 && GS_X_OWNER(x) != h->id && !s->cache) {
        free_remote_batched(h, s, idx, call);
        return;
    }
    /* Ownerless: the batch for s, if any, goes first; pushing it may adopt
       s, and then this free is local. */
    if (h && GS_RB_COUNT(h->rbatch)) {
        gsi_remote_flush(h);
        x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
        if (GS_X_OWNER(x) == h->id) {
            gsi_heap_free_local(h, s, idx, call);
            return;
        }
    }
    bool marked = false;
    for (;;) {
        if (GS_X_OWNER(x) == 0 && h) {
            /* Ownerless (full and released, or orphaned): take it, then the
               free is local. Acquire: as in gsi_slab_adopt(). */
            if (!atomic_compare_exchange_weak_explicit(
                    &s->xstate, &x, GS_X_MAKE(h->id, GS_X_HEAD(x), GS_X_COUNT(x)),
                    memory_order_acquire, memory_order_relaxed))
                continue;
            atomic_store_explicit(&s->owner_key, h->key, memory_order_relaxed);
            if (marked)
                gsi_link_store(s, idx, GS_LINK_ALLOCATED); /* we own it now */
            gsi_heap_take_adopted(h, s);
            gsi_heap_free_local(h, s, idx, call);
            return;
        }
        GS_ASSERT(!h || GS_X_OWNER(x) != h->id);
        uint16_t next = (uint16_t)(GS_LINK_REMOTE | GS_X_HEAD(x));
        if (!marked) {
            /* The state check and the claim are one CAS, so two threads
               freeing the same object cannot both succeed. */
            uint16_t expect = GS_LINK_ALLOCATED;
            if (!__atomic_compare_exchange_n(&s->link[idx], &expect, next, false,
                                             __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                gsi_bad_free(call, p, expect);
            marked = true;
        } else {
            gsi_link_store(s, idx, next);
        }
        /* Release: publishes the link write above to the owner's acquire
           CAS in gsi_slab_collect(). */
        if (atomic_compare_exchange_weak_explicit(
                &s->xstate, &x, GS_X_MAKE(GS_X_OWNER(x), idx, GS_X_COUNT(x) + 1),
                memory_order_release, memory_order_relaxed))
            return;
    }
}
