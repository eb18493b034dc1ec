/*
 * Thread heaps: each thread allocates from its own heap, one active slab
 * per size class, with no atomic read-modify-write and no lock on the fast
 * paths (malloc.c). This file holds the heap's slow paths: refill, a slab
 * that empties, adoption, thread exit (abandonment), fork.
 *
 * A heap owns its active slabs, a partial list per class (slabs with free
 * objects) and a waiting list per class (slabs whose only free objects are
 * pending a grace period). A slab that is completely allocated is released
 * (made ownerless): a later free into it adopts it, the way SLUB puts a full
 * slab back on a partial list on its first free. A heap whose thread exits
 * releases everything; slabs that still hold free or pending objects go to
 * the class's orphan list, where refilling heaps adopt them.
 *
 * Locks: heap_lock (heap table and pool), orphan_lock[c] (orphan list of
 * class c: orphan_next/orphan_prev/orphaned of its slabs). Lock order:
 * heap_lock -> orphan_lock -> segment_lock.
 */
#include "alloc/internal.h"
#include "rcu/internal.h"

#include <errno.h>
#include <string.h>
#include <sys/single_threaded.h>

#define EXTEND_BATCH 256 /* never-used objects linked per refill */
/* Empty slabs a heap keeps for reuse instead of returning them to their
   segment (GRACESLAB_HEAP_EMPTY_KB, 2 MiB): a program that allocates and
   frees batches then never touches the segment lock, and the bound keeps
   idle threads from holding much memory. */
#define HEAP_EMPTY_KEEP ((size_t)gsi_option(GSI_OPT_HEAP_EMPTY_KB) << 10)

/* Beyond that, a heap may keep more empty slabs from a budget all heaps
   share (GRACESLAB_HEAP_SHARED_KEEP_MB, 16 MiB): a thread that frees and
   allocates again a batch larger than 2 MiB then skips the segment lock
   for most of it, while the total kept stays bounded however many threads
   there are. The budget is part of the process's empty-slab cache
   (gsi_segments_empty_budget: GRACESLAB_EMPTY_CACHE_MB, 32 MiB, or half
   the bytes of the slabs in use if more): slabs kept here and empty slots kept
   committed in the segments add up to at most that (give or take a slab
   each way: the two counts are not updated under one lock), so memory
   that stays committed after a program frees everything does not grow.
   A heap whose own keep is 0 keeps nothing. Relaxed: byte counts that
   bound memory; no data is published through them. */
static _Atomic size_t shared_keep_bytes;

/* And a heap keeps no more emptied slabs of a class than it made active
   (keep_credit): what a consumer empties of a producer's slabs goes back
   to the segments, where the producer's next slab comes from. Credits
   saved per class: 512 slabs, more than the byte bounds let one heap keep
   (its own 2 MiB and the shared 16 MiB: 288 one-slot slabs), so a thread
   that frees what it allocated is bounded by those alone. */
#define KEEP_CREDIT_MAX 512

/* The heaps' own keeps together (the sum of every heap's empty_bytes, give
   or take a slab after a fork child reset a lost heap's count) stay within
   GRACESLAB_HEAP_EMPTY_TOTAL_MB (32 MiB). Without it the bound was per
   thread: 400 threads that each allocated and freed 3 MB held 898 MB
   resident while idle (glibc 91 MB, jemalloc 105 MB), and kept it. Relaxed,
   as above. */
static _Atomic size_t own_keep_bytes;

size_t gsi_heap_shared_kept_bytes(void)
{
    return atomic_load_explicit(&shared_keep_bytes, memory_order_relaxed);
}

size_t gsi_heap_own_kept_bytes(void)
{
    return atomic_load_explicit(&own_keep_bytes, memory_order_relaxed);
}

/* Adds bytes to *count if it stays within cap; false (nothing added) if not. */
static bool budget_take(_Atomic size_t *count, size_t bytes, size_t cap)
{
    size_t cur = atomic_load_explicit(count, memory_order_relaxed);
    do {
        if (cur + bytes > cap)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(count, &cur, cur + bytes,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

static bool own_keep_take(size_t bytes)
{
    return budget_take(&own_keep_bytes, bytes,
                       (size_t)gsi_option(GSI_OPT_HEAP_EMPTY_TOTAL_MB) << 20);
}

/* Within its own cap, and within what the empty-slab cache leaves beside
   the segments' dirty slots (read once: a hint, as before). */
static bool shared_keep_take(size_t bytes)
{
    size_t cap = (size_t)gsi_option(GSI_OPT_HEAP_SHARED_KEEP_MB) << 20;
    size_t cache = gsi_segments_empty_budget();
    size_t dirty = gsi_segments_dirty_bytes();
    size_t room = cache > dirty ? cache - dirty : 0;
    return budget_take(&shared_keep_bytes, bytes, cap < room ? cap : room);
}

/* s stops being a kept empty slab: its bytes leave whichever count had
   them (h: its heap, NULL when that count is being reset anyway). */
static void keep_drop(struct gs_heap *h, struct gs_slab *s)
{
    size_t bytes = (size_t)s->span * GS_SLOT_SIZE;
    bool shared = s->kept_shared;
    /* The flags first: a fork child that finds them still set (its owner
       stopped in between) drops the slab again, and a second subtraction
       would wrap the shared count; this way it can at worst leave one
       slab's worth counted. */
    s->kept_empty = false;
    s->kept_shared = false;
    /* Compiler barrier: the child sees this thread's stores in the order
       it executed them, and the compiler must keep that order. */
    atomic_signal_fence(memory_order_seq_cst);
    if (shared) {
        atomic_fetch_sub_explicit(&shared_keep_bytes, bytes, memory_order_relaxed);
    } else {
        if (h)
            h->empty_bytes -= bytes;
        atomic_fetch_sub_explicit(&own_keep_bytes, bytes, memory_order_relaxed);
    }
}

struct gs_slab gsi_empty_slab = {.free_head = GS_LINK_END, .kind = GS_SLAB_UNUSED};
struct gs_heap gsi_empty_heap = {.direct = {[0 ... GS_DIRECT_ENTRIES - 1] = &gsi_empty_slab},
                                  .active = {[0 ... GS_NCLASSES - 1] = &gsi_empty_slab},
                                  .key = 1};
__thread struct gs_heap *gsi_tls_heap = &gsi_empty_heap;
__thread struct gs_heap *gsi_tls_mine = &gsi_empty_heap;
/* Set once this thread's heap has been abandoned at its exit: a heap it
   makes after that (a later destructor's malloc) may outlive it, so it
   is keyed by its address, not by the thread pointer. */
static __thread bool tls_exiting;
/* heap_key exists, so a heap can be registered for abandonment at thread
   exit. Written once in the initialisation; read after gsi_heap_init_once
   (whose acquire pairs with the initialisation's release). */
static bool key_ready;
bool gsi_valgrind;

static pthread_mutex_t heap_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gs_heap *heap_all;    /* every heap ever made (heap_lock) */
static struct gs_heap *heap_pool;   /* heaps without a thread (heap_lock) */
static uint32_t heap_next_id = 1;   /* heap_lock */

/* Newest first, linked through orphan_next/orphan_prev. */
struct orphan_chain {
    struct gs_slab *first, *last;
};

struct orphan_list {
    pthread_mutex_t lock;
    /* Orphans that keep free objects committed (orphan_free > 0), newest
       first; and those that keep none (their free pages given back, or
       only never-used or pending objects), which refills take last. */
    struct orphan_chain kept, bare;
    _Atomic size_t count; /* racy hint read without the lock */
    /* Bytes of the free objects its slabs keep committed (orphan_free of
       each; written under the lock, read as a hint by orphan_evict). */
    _Atomic size_t free_bytes;
};
static struct orphan_list orphans[GS_NCLASSES];
/* Per class, refills that used up a slab or looked for an orphan or a
   new slab: the demand that slabs shed by takeovers meet
   (gsi_heap_take_adopted). Relaxed: a count compared for change only. */
static _Atomic uint32_t class_demand[GS_NCLASSES];

static pthread_key_t heap_key;
static _Atomic int init_state; /* 0: not yet, 2: done */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread bool in_init;

static void heap_abandon(struct gs_heap *h);
static void fork_prepare(void);
static void fork_parent(void);
static void fork_child(void);

/* ------------------------------------------------------------------ lists */

void gsi_heap_list_push(struct gs_slab_list *l, struct gs_slab *s)
{
    s->prev = NULL;
    s->next = l->first;
    if (l->first)
        l->first->prev = s;
    else
        l->last = s;
    l->first = s;
    l->count++;
}

static void list_append(struct gs_slab_list *l, struct gs_slab *s)
{
    s->next = NULL;
    s->prev = l->last;
    if (l->last)
        l->last->next = s;
    else
        l->first = s;
    l->last = s;
    l->count++;
}

void gsi_heap_list_remove(struct gs_slab_list *l, struct gs_slab *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        l->first = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        l->last = s->prev;
    s->next = s->prev = NULL;
    l->count--;
}

static void heap_set_active(struct gs_heap *h, unsigned cls, struct gs_slab *s)
{
    h->active[cls] = s;
    for (unsigned i = gsi_classes[cls].direct_first; i < gsi_classes[cls].direct_end; i++)
        h->direct[i] = s;
}

/* Class cls's bit in its word of partial_classes (cls >> 6). */
static uint64_t partial_bit(unsigned cls)
{
    return (uint64_t)1 << (cls & 63);
}

static void unlink_owned(struct gs_heap *h, struct gs_slab *s)
{
    if (s->kept_empty)
        keep_drop(h, s);
    if (s->where == GS_IN_PARTIAL) {
        gsi_heap_list_remove(&h->partial[s->cls], s);
        if (!h->partial[s->cls].first)
            h->partial_classes[s->cls >> 6] &= ~partial_bit(s->cls);
    } else if (s->where == GS_IN_KEPT)
        gsi_heap_list_remove(&h->kept[s->cls], s);
    else if (s->where == GS_IN_WAITING)
        gsi_heap_list_remove(&h->waiting[s->cls], s);
    else if (s->where == GS_IN_FULL || s->where == GS_IN_PARKED) {
        gsi_heap_list_remove(&h->full[s->cls], s);
        gsi_heap_slab_unpark(s);
    } else if (s->where == GS_IN_ACTIVE) {
        heap_set_active(h, s->cls, &gsi_empty_slab);
        s->used = gsi_slab_recount(s); /* drop the advance charge (see refill) */
    }
    s->where = GS_IN_NONE;
}

static void make_partial(struct gs_heap *h, struct gs_slab *s)
{
    s->where = GS_IN_PARTIAL;
    gsi_heap_list_push(&h->partial[s->cls], s);
    h->partial_classes[s->cls >> 6] |= partial_bit(s->cls);
}

/* ---------------------------------------------------------------- orphans */

/* The orphans' budget. A slab that loses its owner with free objects goes
   on its class's orphan list (thread exit; a sweep settling a slab it
   adopted), where nobody decays it, and it may wait long for an adopter:
   2000 blocks of 33..256 KiB, 75 % freed by a thread that then exited,
   left 225 MB resident for 72 MB live (jemalloc 81 MB, mimalloc 112 MB).
   Giving every orphan's free pages back made a program that starts threads
   one after another, each leaving 12 of its 16 medium blocks free, 12
   times slower (each thread faulted the last one's pages back in). So the
   medium orphans keep up to a quarter of GRACESLAB_EMPTY_CACHE_MB (8 MiB)
   of free objects committed for the next adopter (orphan_keep), the
   oldest of the class that keeps the most giving theirs back first
   (orphan_evict), so that orphans nobody adopts do not hold the budget for
   good (first come first served, a review's program that once left 500
   blocks of 36 KB free in an exiting thread then ran every later thread
   6 to 11 times slower). Orphans that keep nothing wait on a list of
   their own, so that refills take committed ones first and eviction finds
   the oldest committed one without a walk (a walk bounded at 64 found
   none behind a pile of bare ones, and the budget was held for good
   again). Bytes, the sum of each listed slab's orphan_free objects, added
   and taken off under the class's lock. */
_Atomic size_t gsi_orphan_free_bytes;

static size_t orphan_budget(void)
{
    return ((size_t)gsi_option(GSI_OPT_EMPTY_CACHE_MB) << 20) / 4;
}

void gsi_orphan_push(struct gs_slab *s, uint32_t committed_free)
{
    struct orphan_list *o = &orphans[s->cls];
    pthread_mutex_lock(&o->lock);
    /* s was released just before (abandon_slab). Meanwhile a remote free
       may have adopted it, and its new owner may even have emptied and
       retired it: listing it then would leave a stale entry through which
       a later refill adopts a slab that is gone or reused. So list it only
       while it is still ownerless (a new owner removes the entry under this
       lock, gsi_heap_take_adopted). */
    if (!s->orphaned &&
        GS_X_OWNER(atomic_load_explicit(&s->xstate, memory_order_relaxed)) == 0 &&
        s->kind == GS_SLAB_SMALL) {
        s->orphaned = true;
        s->orphan_free = (uint8_t)committed_free;
        size_t bytes = committed_free * s->obj_size;
        atomic_fetch_add_explicit(&gsi_orphan_free_bytes, bytes, memory_order_relaxed);
        atomic_store_explicit(&o->free_bytes,
                              atomic_load_explicit(&o->free_bytes, memory_order_relaxed) + bytes,
                              memory_order_relaxed);
        struct orphan_chain *c = committed_free ? &o->kept : &o->bare;
        s->orphan_prev = NULL;
        s->orphan_next = c->first;
        if (c->first)
            c->first->orphan_prev = s;
        else
            c->last = s;
        c->first = s;
        atomic_fetch_add_explicit(&o->count, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&o->lock);
}

static void orphan_unlink_locked(struct orphan_list *o, struct gs_slab *s)
{
    /* orphan_free, set when listed, says which chain. */
    struct orphan_chain *c = s->orphan_free ? &o->kept : &o->bare;
    if (s->orphan_prev)
        s->orphan_prev->orphan_next = s->orphan_next;
    else
        c->first = s->orphan_next;
    if (s->orphan_next)
        s->orphan_next->orphan_prev = s->orphan_prev;
    else
        c->last = s->orphan_prev;
    s->orphan_next = s->orphan_prev = NULL;
    s->orphaned = false;
    size_t bytes = s->orphan_free * s->obj_size;
    atomic_fetch_sub_explicit(&gsi_orphan_free_bytes, bytes, memory_order_relaxed);
    atomic_store_explicit(&o->free_bytes,
                          atomic_load_explicit(&o->free_bytes, memory_order_relaxed) - bytes,
                          memory_order_relaxed);
    s->orphan_free = 0;
    atomic_fetch_sub_explicit(&o->count, 1, memory_order_relaxed);
}

/* Orphan-list membership is a hint: an orphan may be adopted by a free
   before the list lock is taken. Whoever adopts or retires a slab removes
   it here, so the list never holds a retired slab. */
void gsi_orphan_remove(struct gs_slab *s)
{
    struct orphan_list *o = &orphans[s->cls];
    if (!atomic_load_explicit(&o->count, memory_order_relaxed))
        return;
    pthread_mutex_lock(&o->lock);
    if (s->orphaned)
        orphan_unlink_locked(o, s);
    pthread_mutex_unlock(&o->lock);
}

/* Why a heap gives a slab up (give_up_slab). */
enum give_up {
    GIVE_UP_ABANDON, /* thread exit, fork child, a sweep settling a slab */
    GIVE_UP_EVICT,   /* an orphan adopted to give its free pages back */
    GIVE_UP_SHED,    /* a partial slab past GS_TAKEOVER_PARTIAL */
};
static void give_up_slab(struct gs_heap *h, struct gs_slab *s, enum give_up why);

/* Makes room in the orphans' budget: the medium class whose orphans keep
   the most free bytes committed gives back those of its oldest orphan
   that keeps any (the last of its kept chain). h adopts that orphan to do
   it (only an owner may walk a slab's free list), under the list's lock,
   as orphan_adopt does, so that it cannot be retired in between; an entry
   whose slab has an owner already (adopted without unlinking it:
   gs_free_rcu, sweeps) just leaves the list and the count. False if no
   orphan keeps anything. */
static bool orphan_evict(struct gs_heap *h)
{
    struct orphan_list *o = NULL;
    size_t most = 0;
    for (unsigned c = GS_FIRST_MEDIUM_CLASS; c < GS_NCLASSES; c++) {
        size_t b = atomic_load_explicit(&orphans[c].free_bytes, memory_order_relaxed);
        if (b > most) {
            most = b;
            o = &orphans[c];
        }
    }
    if (!o)
        return false;
    bool adopted = false;
    pthread_mutex_lock(&o->lock);
    struct gs_slab *s = o->kept.last;
    if (s) {
        orphan_unlink_locked(o, s);
        adopted = gsi_slab_adopt(h, s);
    }
    pthread_mutex_unlock(&o->lock);
    if (adopted)
        give_up_slab(h, s, GIVE_UP_EVICT);
    return s != NULL;
}

/* The owner of s, about to give it up: how many of its free objects it
   may leave committed on the orphan list (0: it gave their pages back).
   A slab shed by a live heap (GIVE_UP_SHED) keeps them whatever the
   budget: an allocating heap of the class likely adopts it soon, and a
   consumer in a pipeline of medium blocks that gave each shed slab's pages
   back ran 3 to 5 times slower (a review's bench/handoff with 36..200 KB
   blocks: 0.04 M replacements/s against 0.2, 517,000 page faults against
   121,000). What it keeps counts, so the next thread exit or sweep that
   gives a slab up makes room by eviction. */
static uint32_t orphan_keep(struct gs_heap *h, struct gs_slab *s, enum give_up why)
{
    uint32_t mask = gsi_slab_committed_free(s);
    if (!mask)
        return 0;
    uint32_t n = (uint32_t)__builtin_popcount(mask);
    if (why == GIVE_UP_SHED)
        return n;
    size_t bytes = (size_t)n * s->obj_size;
    /* A few evictions at most: each is an adoption and a madvise. */
    for (int tries = 0; why == GIVE_UP_ABANDON && tries < 4; tries++) {
        if (atomic_load_explicit(&gsi_orphan_free_bytes, memory_order_relaxed) + bytes <=
            orphan_budget())
            return n;
        if (!orphan_evict(h))
            break;
    }
    gsi_slab_decommit_free(s, mask);
    return 0;
}

static struct gs_slab *orphan_adopt(struct gs_heap *h, unsigned cls)
{
    struct orphan_list *o = &orphans[cls];
    if (!atomic_load_explicit(&o->count, memory_order_relaxed))
        return NULL;
    struct gs_slab *got = NULL;
    pthread_mutex_lock(&o->lock);
    struct gs_slab *s;
    while (!got && ((s = o->kept.first) || (s = o->bare.first))) {
        orphan_unlink_locked(o, s);
        if (gsi_slab_adopt(h, s))
            got = s;
    }
    pthread_mutex_unlock(&o->lock);
    return got;
}

/* ------------------------------------------------------------------ heaps */

static void heap_clear_active(struct gs_heap *h)
{
    for (unsigned c = 0; c < GS_NCLASSES; c++)
        h->active[c] = &gsi_empty_slab;
    for (unsigned i = 0; i < GS_DIRECT_ENTRIES; i++)
        h->direct[i] = &gsi_empty_slab;
}

static struct gs_heap *heap_create_locked(void)
{
    struct gs_heap *h = heap_pool;
    if (h) {
        heap_pool = h->next_pool;
        /* Abandoning left its entries empty, unless a fork child abandoned
           it for a thread that vanished halfway through changing them
           (between active[] and direct[] in heap_set_active): the slab a
           stale direct[] entry names may since be someone else's. So they
           are cleared below like a new heap's. */
        h->empty_bytes = 0;
        h->rbatch_slab = NULL;
        __atomic_store_n(&h->rbatch, 0, __ATOMIC_RELAXED);
    } else {
        size_t bytes = (sizeof *h + GS_PAGE - 1) & ~(size_t)(GS_PAGE - 1);
        h = gsi_os_map_aligned(bytes, GS_PAGE);
        if (!h)
            return NULL;
        h->id = heap_next_id++;
        h->next_all = heap_all;
        heap_all = h;
    }
    heap_clear_active(h);
    memset(h->keep_credit, 0, sizeof h->keep_credit);
    memset(h->demand_seen, 0, sizeof h->demand_seen);
    memset(h->shed_credit, 0, sizeof h->shed_credit);
    memset(h->partial_classes, 0, sizeof h->partial_classes);
    h->decay_ns = 0;
    h->decay_pass = 0;
    h->key = (uintptr_t)h;
    h->thread_ptr = 0; /* set by gsi_heap_get for a thread's heap */
    return h;
}

static void thread_exit(void *arg)
{
    struct gs_heap *h = arg;
    tls_exiting = true;
    gsi_rcu_thread_exiting();
    if (h && h == gsi_tls_mine)
        heap_abandon(h);
}

void gsi_heap_init_once(void)
{
    if (GS_LIKELY(atomic_load_explicit(&init_state, memory_order_acquire) == 2))
        return;
    if (in_init)
        return; /* a call made by the init below (pthread_atfork may malloc) */
    pthread_mutex_lock(&init_lock);
    if (atomic_load_explicit(&init_state, memory_order_relaxed) != 2) {
        in_init = true;
        gsi_classes_init();
        gsi_valgrind = GS_VG_RUNNING() && gsi_option(GSI_OPT_VALGRIND) != 0;
        for (unsigned c = 0; c < GS_NCLASSES; c++)
            pthread_mutex_init(&orphans[c].lock, NULL);
        key_ready = pthread_key_create(&heap_key, thread_exit) == 0;
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        in_init = false;
        /* Release pairs with the acquire load above: classes and locks are
           ready before any thread skips this function. */
        atomic_store_explicit(&init_state, 2, memory_order_release);
    }
    pthread_mutex_unlock(&init_lock);
}

/* Live heaps made for this thread's thread pointer other than its own heap
   belonged to a thread that exited without abandoning them (a heap made in
   the last round of thread-specific destructors, or whose registration
   failed): a thread pointer names one running thread, and glibc handed it
   on to this one. Nobody else acts for such a heap, so this thread
   abandons it, as a fork child abandons the heaps of the threads it lost.
   Until then, if the dead heap was keyed by the thread pointer, this
   thread's fast-path frees into its slabs are the owner's frees they look
   like; if it was keyed by its address (made after the thread had
   abandoned its first heap), they go the remote way. */
static void abandon_dead_heaps(void)
{
    uintptr_t key = gsi_thread_key();
    for (;;) {
        struct gs_heap *dead = NULL;
        pthread_mutex_lock(&heap_lock);
        for (struct gs_heap *h = heap_all; h && !dead; h = h->next_all)
            if (h->live && h->thread_ptr == key && h != gsi_tls_mine)
                dead = h;
        pthread_mutex_unlock(&heap_lock);
        if (!dead)
            return;
        heap_abandon(dead);
    }
}

void gsi_heap_free_emptied(const void *p, struct gs_slab *s)
{
    GS_ASSERT((char *)p >= s->start && (char *)p < s->start + (size_t)s->capacity * s->obj_size);
    struct gs_heap *h = gsi_tls_mine;
    uint64_t x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
    if (GS_LIKELY(GS_X_OWNER(x) == h->id && h != &gsi_empty_heap)) {
        unsigned cls = s->cls;
        bool parked = s->where == GS_IN_PARKED;
        gsi_heap_slab_empty(h, s);
        if (parked)
            return; /* not emptied: unparked (no decay pass per medium free) */
        /* A thread that only frees (a consumer, a teardown) still decays
           its medium objects: a slab emptying is its slow path. */
        gsi_heap_decay(h, cls);
        return;
    }
    /* s matched this thread's key but another heap owns it: a dead
       thread's heap (see above). Abandoning that heap settles s too. */
    abandon_dead_heaps();
}

struct gs_heap *gsi_heap_get(void)
{
    struct gs_heap *h = gsi_tls_mine;
    if (GS_LIKELY(h != &gsi_empty_heap))
        return h;
    gsi_heap_init_once();
    /* The initialisation may have made this thread's heap (a malloc inside
       pthread_atfork): that one is the thread's heap, not a second one. */
    h = gsi_tls_mine;
    if (h == &gsi_empty_heap) {
        /* The key is decided before the heap owns anything: the thread
           pointer only if thread_exit will abandon the heap (registered,
           and the thread is not already past that); see gs_heap.key. */
        bool by_thread = key_ready && !tls_exiting && !gsi_valgrind;
        pthread_mutex_lock(&heap_lock);
        h = heap_create_locked();
        if (h) {
            h->live = true;
            h->thread_ptr = gsi_thread_key();
            if (by_thread)
                h->key = h->thread_ptr;
        }
        pthread_mutex_unlock(&heap_lock);
        if (!h)
            return NULL;
        gsi_tls_mine = h;
        gsi_tls_heap = gsi_valgrind ? &gsi_empty_heap : h;
        abandon_dead_heaps();
    }
    if (key_ready && pthread_getspecific(heap_key) != h)
        pthread_setspecific(heap_key, h);
    return h;
}

/* A heap with no thread: the owner identity of a cache's slabs. */
struct gs_heap *gsi_heap_detached(void)
{
    gsi_heap_init_once();
    pthread_mutex_lock(&heap_lock);
    struct gs_heap *h = heap_create_locked();
    pthread_mutex_unlock(&heap_lock);
    return h;
}

void gsi_heap_detached_put(struct gs_heap *h)
{
    pthread_mutex_lock(&heap_lock);
    h->next_pool = heap_pool;
    heap_pool = h;
    pthread_mutex_unlock(&heap_lock);
}

void gsi_heaps_foreach(void (*fn)(struct gs_heap *, void *), void *arg)
{
    pthread_mutex_lock(&heap_lock);
    for (struct gs_heap *h = heap_all; h; h = h->next_all)
        fn(h, arg);
    pthread_mutex_unlock(&heap_lock);
}

/* ----------------------------------------------------------------- refill */

/* s is owned by h, on no list, and has no free object left. With objects
   pending a grace period it waits on the waiting list (oldest first);
   otherwise it is released, or kept on the partial list if remote frees
   arrived meanwhile. */
/* A used-up medium slab on (or going onto) the full list: its count,
   capacity, becomes the watch of 1 (see "Full slabs"). */
static void park(struct gs_slab *s)
{
    GS_ASSERT(s->used == s->capacity && s->capacity > 1);
    s->used = 1;
    s->where = GS_IN_PARKED;
}

static void put_exhausted(struct gs_heap *h, struct gs_slab *s)
{
    if (gsi_slab_has_pending(s)) {
        s->wait_cookie = gsi_slab_pending_cookie(s);
        s->where = GS_IN_WAITING;
        list_append(&h->waiting[s->cls], s);
        gsi_pending_kick();
        return;
    }
    if (h->keep_full) {
        /* Exhausted: every object is allocated (none free, none pending,
           none never linked, the remote chain just found empty), so
           `used` == capacity, and a medium slab's watch of 1 stands for
           it (see "Full slabs"). */
        if (s->cls >= GS_FIRST_MEDIUM_CLASS)
            park(s);
        else
            s->where = GS_IN_FULL;
        list_append(&h->full[s->cls], s);
        return;
    }
    if (gsi_slab_release(h, s))
        return;
    /* The release failed because the remote chain is not empty; the chain
       only grows until the owner collects, so this gets at least one. */
    gsi_slab_collect(s);
    make_partial(h, s);
}

/* Full slabs. A used-up slab is normally released (ownerless), so that the
   thread that frees its objects adopts it and frees locally: a consumer
   ends up owning a producer's slabs. But with many blocks live and freed
   at random by the thread that allocated them, nearly every slab is full,
   and nearly every free adopted back a slab this heap had released, and
   nearly every malloc released one: two CASes on cold lines per operation
   in a single thread, 4 to 7 times slower than the peers with 100,000 live
   blocks (docs/benchmarks.md, "replace"). So a heap that adopts back
   GS_KEEP_FULL_AFTER of its own slabs keeps its used-up slabs owned, on
   its full list: its frees into them take the fast path, as into any slab
   it owns, and refill looks at one of them in turn before its partial
   list and at GS_FULL_POLL more after it, for one they made room in
   (full_poll), before it asks the segments for a new slab.
   (Moving a full slab back to the partial list on its first free, as
   mimalloc does, took a slow path and two neighbours' list links per
   free: 8.6 M replacements/s with 100,000 live blocks, against 20 M
   this way and 5.5 M before.) The turn bounds refill's work; what it costs is free
   blocks a turn has not reached, about one per GS_FULL_POLL full slabs
   of the class.
   Medium slabs (4 to 16 blocks of 36 KiB and up) cannot leave free blocks
   to a turn: a program that kept replacing the oldest of 1000 such blocks
   made new slabs, faulting their pages in, for blocks the turn had not
   reached (its first 0.2 s: 0.10 M replacements/s against 0.18 M). Nor
   was releasing them cheap: half its mallocs released a used-up slab and
   half its frees adopted one back. So a medium slab is parked instead:
   on the full list with `used` set to 1, a watch, so that the owner's
   first free into it (fast path included) takes `used` to zero and the
   slow path, which counts it again (capacity - 1) and makes it partial
   (gsi_heap_slab_empty). A slow path per freed-into slab is little next
   to the pages of a medium block. Anything else that counts with `used`
   unparks the slab first (unlink_owned, a sweep's settle, which parks it
   again if it reclaimed nothing: gsi_heap_slab_reclaimed).
   Other threads' frees into a full slab go to its remote chain as into
   any owned slab; refill finding any (in its class's turn,
   or in one full slab of another class, full_poll_other), or pending
   objects, means other threads free (or defer) what this heap allocates,
   and the heap goes back to releasing. */
#define GS_KEEP_FULL_AFTER 64
#define GS_FULL_POLL 8

static void keep_full_stop(struct gs_heap *h);

/* Makes s ready to allocate from (true), or says it has nothing. Pending
   objects whose grace period is done become free here, in bulk: this is the
   reclaim path. */
static bool slab_refill(struct gs_slab *s)
{
    return s->free_head != GS_LINK_END || gsi_slab_collect(s) ||
           gsi_pending_reclaim_local(s) || gsi_slab_extend(s, EXTEND_BATCH);
}

/* Pending memory in class cls that makes refill wait for a grace period
   rather than map a new slab: GRACESLAB_PENDING_EXPEDITE_KB (256 KiB by
   default) — a few slabs' worth, so a writer that defers frees keeps its
   footprint within a small bound of its live set, while short bursts never
   block. With the option at 0, any waiting slab is worth waiting for, but
   nothing waiting is not: "always" made gs_free_rcu never adopt the
   deferred object's slab (so nothing ever waited on this heap's lists)
   and left this heap's count out of the class's, and only the lazy sweep
   reclaimed: 95 MiB pending for a 256 KiB live set. */
static size_t waiting_bytes(const struct gs_heap *h, unsigned cls)
{
    return h->waiting[cls].count * gsi_classes[cls].span * GS_SLOT_SIZE;
}

bool gsi_heap_pending_worth_waiting(struct gs_heap *h, unsigned cls)
{
    size_t bytes = waiting_bytes(h, cls);
    return bytes && bytes >= gsi_pending_expedite_bytes();
}

/* The oldest waiting slab of the class, if its grace period is done (after
   nudging the engine: non-blocking), or after waiting for it when `wait`
   (inside a reader: having the lazy thread drive it, and for at most
   GS_READER_WAIT_NS if the grace period in progress completes it). */
static struct gs_slab *waiting_ready(struct gs_heap *h, unsigned cls, bool wait)
{
    struct gs_slab *s = h->waiting[cls].first;
    if (!s)
        return NULL;
    /* Keeps the lazy thread's grace periods going while this thread needs
       them and cannot wait for them (see refill()); renewed whether or not
       the oldest slab is ready yet: a lease that lapsed whenever things
       went well stopped the grace periods until the next stall. */
    if (!wait && gsi_rcu_in_reader() && gsi_heap_pending_worth_waiting(h, cls))
        gsi_rcu_expedite();
    if (!gsi_gp_done(s->wait_cookie)) {
        if (wait) {
            if (!gsi_gp_wait_or_expedite(s->wait_cookie))
                gsi_gp_wait_in_reader(s->wait_cookie, GS_READER_WAIT_NS,
                                      waiting_bytes(h, cls) >= GS_READER_WAIT_ALWAYS_BYTES);
        } else
            gsi_gp_advance();
        if (!gsi_gp_done(s->wait_cookie))
            return NULL;
    }
    unlink_owned(h, s);
    return s;
}

/* The next `turns` full slabs of the class: the first its owner freed
   into becomes the active slab; one with remote frees or pending objects
   ends keep_full (see "Full slabs") and is refilled from if it can be; the
   others go to the tail, so that every full slab is looked at in turn. */
static struct gs_slab *full_poll(struct gs_heap *h, unsigned cls, int turns)
{
    for (int i = 0; i < turns; i++) {
        struct gs_slab *s = h->full[cls].first;
        if (!s)
            break;
        uint64_t x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
        if (s->free_head != GS_LINK_END && !GS_X_COUNT(x)) {
            unlink_owned(h, s);
            return s;
        }
        if (GS_X_COUNT(x) || gsi_slab_has_pending(s)) {
            unlink_owned(h, s);
            keep_full_stop(h);
            if (slab_refill(s))
                return s;
            put_exhausted(h, s);
            return NULL;
        }
        gsi_heap_list_remove(&h->full[cls], s);
        list_append(&h->full[cls], s);
    }
    return NULL;
}

/* One full slab of another class a refill, in turn: remote frees into the
   full slabs of a class this heap no longer allocates are seen too. */
static void full_poll_other(struct gs_heap *h, unsigned cls)
{
    unsigned c = h->poll_cls = (h->poll_cls + 1) % GS_NCLASSES;
    struct gs_slab *s = h->full[c].first;
    if (c == cls || !s)
        return;
    uint64_t x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
    if (GS_X_COUNT(x) || gsi_slab_has_pending(s))
        keep_full_stop(h);
}

/* Back to releasing used-up slabs: every full slab is put where it would
   have gone (released, or waiting if it has pending objects, or partial
   if remote frees came in). */
static void keep_full_stop(struct gs_heap *h)
{
    h->keep_full = false;
    h->self_adopts = 0;
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        struct gs_slab *s;
        while ((s = h->full[c].first)) {
            unlink_owned(h, s);
            put_exhausted(h, s);
        }
    }
}

/* A heap that takes slabs over by freeing into them may never allocate
   from their class (a consumer): its refill, which collects the remote
   frees other threads make into its slabs, then never runs for the class,
   and those frees would wait on the slabs' chains for good while the
   allocator mapped new slabs (one producer, two consumers: 1.5 GB in 8 s
   for at most 1 MB live; a stress helper's case, thirtieth session). So
   each takeover also looks at the partial slab of the class looked at
   longest ago: the list's last, moved to the front. Its remote frees are
   collected, and if that empties it, it goes as any emptied slab.
   Takeovers come at the rate the heap frees through slabs, so each slab
   is looked at in turn. Not a list's only slab: a takeover's caller goes
   on using the slab it has just made partial (push_remote_chain reads its
   count after), and a look that emptied and retired it under the caller
   retired it twice (a review's race, thirty-fourth session). */
static void retire_owned(struct gs_heap *h, struct gs_slab *s);

/* Moves the partial slab of class cls looked at longest ago (the list's
   last, which must exist) to the front and collects its remote chain;
   returns it if that emptied it. */
static struct gs_slab *poll_last(struct gs_heap *h, unsigned cls)
{
    struct gs_slab_list *l = &h->partial[cls];
    struct gs_slab *t = l->last;
    if (t != l->first) {
        gsi_heap_list_remove(l, t);
        gsi_heap_list_push(l, t);
    }
    return gsi_slab_collect(t) && t->used == 0 ? t : NULL;
}

static void poll_partial(struct gs_heap *h, unsigned cls)
{
    struct gs_slab *t;
    if (h->partial[cls].last != h->partial[cls].first && (t = poll_last(h, cls)))
        gsi_heap_slab_empty(h, t);
}

/* And a partial slab of another class per refill, in turn. A heap's
   active slab that other threads keep freeing into lives on its remote
   chain and never runs out, so its class never refills, and the partial
   slabs behind it (taken over, or put there with remote frees) wait with
   their own chains uncollected: a pool of 16 threads freeing each other's
   small blocks held 537 partial slabs for 6 MB live, 324 of them wholly
   free once collected (21 MB). The turn goes to the next class whose
   partial_classes bit is set: a refill looks at no empty list. Here the
   list's only slab is looked at too: refill's caller uses no slab of
   another class. A slab this empties goes back to its segment, not to the
   kept list: the keep is for slabs a heap empties by its own frees, to
   allocate from again, and other threads' frees emptied this one (kept,
   245 of them held 15 MB in the same pool). */
_Static_assert(GS_NCLASSES <= 128, "partial_classes is two words");
static unsigned next_partial_class(const struct gs_heap *h, unsigned after)
{
    unsigned from = after + 1, w = from >> 6;
    /* Word w from bit `from` up, the other word, then word w whole. */
    for (int n = 0; n < 3; n++, w ^= 1) {
        uint64_t m = h->partial_classes[w];
        if (n == 0)
            m &= ~(uint64_t)0 << (from & 63);
        if (m)
            return w * 64 + (unsigned)__builtin_ctzll(m);
    }
    return GS_NCLASSES;
}

static void poll_partial_other(struct gs_heap *h, unsigned cls)
{
    unsigned c = next_partial_class(h, h->partial_poll_cls);
    if (c == GS_NCLASSES)
        return;
    h->partial_poll_cls = c;
    struct gs_slab *t;
    /* Emptied: nothing pending either (used counts pending objects). */
    if (c != cls && h->partial[c].last && (t = poll_last(h, c)))
        retire_owned(h, t);
}

/* The first slab of l that can be refilled, taken off it; the others
   before it go where used-up slabs go. */
static struct gs_slab *refill_from(struct gs_heap *h, struct gs_slab_list *l)
{
    struct gs_slab *s;
    while ((s = l->first)) {
        unlink_owned(h, s);
        if (slab_refill(s))
            return s;
        put_exhausted(h, s);
    }
    return NULL;
}

/* Medium reuse. A heap keeps at most MEDIUM_KEEP_SLABS emptied medium
   slabs of each span, of any classes, the newest, and a refill that would
   make a new medium slab takes the newest kept one of its span instead,
   or else the empty active slab of a smaller class of its span
   (medium_empty_active_below), formatted again for its class (the medium
   classes have two spans: size_class.c). A buffer grown by realloc moves
   up through the classes: its new block's slab is the one the smaller
   blocks just left, its lines still in the cache, and no slab of a class
   it has left waits for the next round (100 buffers grown side by side to
   256 KiB: 63 -> 48 MB peak RSS and 9 % more calls a second; docs/
   benchmarks.md). Kept one per class, as until the thirty-sixth session,
   a medium slab served its class only: every class a program passed
   through held one, and a refill retired the others' beyond 1 MiB to
   their segments, whose committed slots the new slab took in no
   particular order. Two per span: a batch of one size allocated and freed
   while a batch of another is live. */
#define MEDIUM_KEEP_SLABS 2

/* The kept medium slabs of h of `span` slots: the newest, the oldest, and
   how many. A heap keeps few: the walk is short. */
struct medium_kept {
    struct gs_slab *newest, *oldest;
    unsigned count;
};

static struct medium_kept medium_kept_scan(const struct gs_heap *h, unsigned span)
{
    struct medium_kept k = {NULL, NULL, 0};
    for (unsigned c = GS_FIRST_MEDIUM_CLASS; c < GS_NCLASSES; c++)
        for (struct gs_slab *s = h->kept[c].first; s; s = s->next) {
            if (s->span != span)
                continue;
            k.count++;
            if (!k.newest || (int32_t)(s->kept_seq - k.newest->kept_seq) > 0)
                k.newest = s;
            if (!k.oldest || (int32_t)(s->kept_seq - k.oldest->kept_seq) < 0)
                k.oldest = s;
        }
    return k;
}

/* An active slab of a smaller medium class, of cls's span, with every
   object free (NULL if none), nearest class first. The active slab stays
   when it empties (the free fast path does not see it reach zero, and a
   thread that allocates and frees one block at a time must keep it): a
   buffer grown by realloc left one in every class it passed through.
   Smaller only: two classes used one block at a time in turn would
   otherwise take each other's slab at every turn; this way the smaller
   one makes a slab once. */
static struct gs_slab *medium_empty_active_below(const struct gs_heap *h, unsigned cls)
{
    for (unsigned c = cls; c-- > GS_FIRST_MEDIUM_CLASS;) {
        struct gs_slab *s = h->active[c];
        if (s != &gsi_empty_slab && s->span == gsi_classes[cls].span && gsi_slab_recount(s) == 0)
            return s;
    }
    return NULL;
}

static struct gs_slab *refill(struct gs_heap *h, unsigned cls)
{
    poll_partial_other(h, cls);
    struct gs_slab *s = h->active[cls];
    bool used_up = s != &gsi_empty_slab;
    if (used_up) {
        if (slab_refill(s))
            return s;
        unlink_owned(h, s);
        put_exhausted(h, s);
        /* A slab of the class used up: demand, whatever meets it next
           (class_demand; counted here too, as a heap that takes over
           other heaps' slabs refills from its partial list: two threads
           freeing each other's blocks otherwise spent their credit and
           kept every slab they took over, 77 MB for 24 MB live). */
        atomic_fetch_add_explicit(&class_demand[cls], 1, memory_order_relaxed);
    }
    /* One full slab in turn before the partial ones: a heap whose partial
       list never runs dry (it keeps taking over slabs by freeing into
       them) would otherwise never look at its full slabs, and the remote
       frees into them, which end keep_full, would wait for good (two
       threads freeing each other's blocks: 12.8 MB live, 143 MB peak RSS
       after 40 rounds; the same stress helper's case). */
    if (h->full[cls].first && (s = full_poll(h, cls, 1)))
        goto got;
    /* And the partial slab looked at longest ago, to the front: slabs are
       taken from the front, and those that other threads' frees made
       partial (with those frees still on their chains) pile up behind the
       ones this heap's own takeovers and frees push there. */
    poll_partial(h, cls);
    if ((s = refill_from(h, &h->partial[cls])) || (s = refill_from(h, &h->kept[cls])))
        goto got;
    if (h->full[cls].first && (s = full_poll(h, cls, GS_FULL_POLL)))
        goto got;
    if (h->keep_full)
        full_poll_other(h, cls);
    while ((s = waiting_ready(h, cls, false))) {
        if (slab_refill(s))
            goto got;
        put_exhausted(h, s);
    }
    atomic_fetch_add_explicit(&class_demand[cls], 1, memory_order_relaxed);
    while ((s = orphan_adopt(h, cls))) {
        if (slab_refill(s))
            goto got;
        put_exhausted(h, s);
    }
    /* Before asking the OS: if enough of this class is pending, wait for
       its grace period. Never inside a read-side critical section, where
       that would wait for the caller itself: there the lazy thread waits
       for it. Left to the callers' non-blocking nudges (one scan each,
       which a reader preempted inside its section fails), grace periods
       slowed as memory grew, and threads that allocated and deferred
       inside short read-side sections piled up pending memory without
       bound. */
    if (gsi_heap_pending_worth_waiting(h, cls))
        while ((s = waiting_ready(h, cls, true))) {
            if (slab_refill(s))
                goto got;
            put_exhausted(h, s);
        }
    /* Other threads' deferrals of this class wait on slabs this heap does
       not own (a thread that frees what another allocates); the sweep hands
       them to the orphan list once their grace period is done. */
    if (gsi_pending_reclaim_class(cls)) {
        while ((s = orphan_adopt(h, cls))) {
            if (slab_refill(s))
                goto got;
            put_exhausted(h, s);
        }
    }
    /* An active slab at the start means refill found it used up. A
       thread's heap places its slabs in segments of its own once it has
       made a few (segment.c, place_locked). */
    if (cls >= GS_FIRST_MEDIUM_CLASS &&
        ((s = medium_kept_scan(h, gsi_classes[cls].span).newest) ||
         (s = medium_empty_active_below(h, cls)))) {
        unlink_owned(h, s);
        gsi_orphan_remove(s); /* a stale entry's list is its old class's */
        gsi_slab_reformat(s, cls);
        gsi_slab_extend(s, EXTEND_BATCH);
        goto got;
    }
    uint32_t affinity = h->thread_ptr && h->slabs_made >= GS_HEAP_CLAIM_AFTER ? h->id : 0;
    h->slabs_made++;
    s = gsi_slab_new(cls, used_up, affinity);
    if (!s)
        return NULL;
    if (!gsi_slab_adopt(h, s))
        GS_ASSERT(!"a new slab is ownerless");
    gsi_slab_extend(s, EXTEND_BATCH);
got:
    /* While a slab is active, `used` carries an advance charge instead of
       an exact count: malloc's fast path does not count (no store-to-load
       chain through the counter between malloc and free), and the free
       fast path never sees the active slab reach zero, so a thread that
       allocates and frees one object at a time stays on the fast path.
       unlink_owned() recounts. */
    s->used += GS_ACTIVE_CHARGE;
    s->where = GS_IN_ACTIVE;
    heap_set_active(h, cls, s);
    if (h->keep_credit[cls] < KEEP_CREDIT_MAX)
        h->keep_credit[cls]++;
    return s;
}

void *gsi_heap_alloc_slow(struct gs_heap *h, unsigned cls, size_t size, bool *zeroed)
{
    if (GS_UNLIKELY(h == &gsi_empty_heap)) {
        /* First allocation of this thread (or any allocation under
           Valgrind) (or of the process: the class
           table may not have been ready when cls was computed). */
        h = gsi_heap_get();
        if (!h && gsi_oom_reclaim())
            h = gsi_heap_get();
        if (!h) {
            errno = ENOMEM;
            return NULL;
        }
        cls = gsi_size_class(size);
    }
    if (GS_UNLIKELY(atomic_load_explicit(&gsi_pending_unarmed, memory_order_relaxed)))
        gsi_pending_kick();
    struct gs_slab *s = refill(h, cls);
    if (GS_UNLIKELY(!s)) {
        if (gsi_oom_reclaim())
            s = refill(h, cls);
        if (!s) {
            errno = ENOMEM;
            return NULL;
        }
    }
    gsi_heap_decay(h, cls);
    if (zeroed)
        *zeroed = gsi_slab_next_is_zero(s);
    void *p = gsi_slab_pop_counted(s);
    GS_VG_ALLOC(p, size, 0);
    return p;
}

/* ------------------------------------------------------------------ frees */

void gsi_heap_free_local(struct gs_heap *h, struct gs_slab *s, uint32_t idx, const char *call)
{
    uint16_t v = gsi_link_load(s, idx);
    if (GS_UNLIKELY(v != GS_LINK_ALLOCATED))
        gsi_bad_free(call, s->start + (size_t)idx * s->obj_size, v);
    gsi_slab_push(s, idx, s->start + (size_t)idx * s->obj_size);
    if (--s->used == 0)
        gsi_heap_slab_empty(h, s);
}

/* An empty slab h owns goes back to its segment (off h's lists, and off
   the orphan list it may also be on). */
static void retire_owned(struct gs_heap *h, struct gs_slab *s)
{
    unlink_owned(h, s);
    gsi_orphan_remove(s);
    gsi_slab_retire(s);
}

void gsi_heap_slab_unpark(struct gs_slab *s)
{
    /* The watch is 1, or 0 when a free took it there and its slow path
       has not run yet: a thread freeing into a dead thread's heap's slab
       abandons that heap first (gsi_heap_free_emptied), which unparks
       the slab here with that free already made. */
    if (s->where == GS_IN_PARKED) {
        GS_ASSERT(s->used <= 1);
        s->used = s->capacity - 1 + s->used;
        s->where = GS_IN_FULL;
    }
}

void gsi_heap_slab_empty(struct gs_heap *h, struct gs_slab *s)
{
    /* The owner freed into a parked slab: the watch of 1 stood for its
       capacity (see "Full slabs"). */
    if (s->where == GS_IN_PARKED) {
        unlink_owned(h, s); /* unparks: used 0 becomes capacity - 1 */
        make_partial(h, s);
        return;
    }
    /* The active slab's charge ran out (2^62 frees): charge it again. It
       is kept even when empty: a thread that allocates and frees one
       object at a time must not map and unmap a slab per call. */
    if (GS_UNLIKELY(s->where == GS_IN_ACTIVE)) {
        s->used = gsi_slab_recount(s) + GS_ACTIVE_CHARGE;
        return;
    }
    if (gsi_slab_has_pending(s) || s->kept_empty)
        return;
    size_t bytes = (size_t)s->span * GS_SLOT_SIZE, keep = HEAP_EMPTY_KEEP;
    bool own = false, kept = false;
    /* A heap keeps no more slabs of a class than it made active (a
       credit each): a thread that frees what others allocated, as a
       consumer does, would otherwise hold the slabs it empties for
       nothing while their allocator maps new ones (bench/prodcons: 2 to
       20 MB peak RSS for 64 KiB in flight, and so again when the
       consumer allocated one block of the class). Retired, they reach the
       allocator through the class's ready list. Medium slabs, of all
       classes of a span together, MEDIUM_KEEP_SLABS at most, the newest
       ("Medium reuse", above): one kept per medium class made `git
       pack-objects` peak at 40 MB (jemalloc 27), as a program's buffers
       pass through many sizes. Keeping none cost a trip to the segment lock per
       emptied and per new slab, which made a loop that allocates and
       frees a slab's worth of one medium size at a time 3 times slower (a
       review: 64 M -> 22 M pairs/s at 40,000 B, 6 a batch). */
    if (h->live && keep && h->keep_credit[s->cls]) {
        own = h->empty_bytes + bytes <= keep && own_keep_take(bytes);
        kept = own || shared_keep_take(bytes);
    }
    if (kept) {
        /* The newest medium slabs of its span: the oldest gives way (once
           s is kept: a refused keep retiring it too left none). */
        if (s->cls >= GS_FIRST_MEDIUM_CLASS) {
            struct medium_kept k = medium_kept_scan(h, s->span);
            if (k.count >= MEDIUM_KEEP_SLABS)
                retire_owned(h, k.oldest);
        }
        h->keep_credit[s->cls]--;
        unlink_owned(h, s);
        /* On its own list: partly used slabs are refilled first. */
        s->kept_empty = true;
        s->kept_shared = !own;
        if (own)
            h->empty_bytes += bytes;
        s->where = GS_IN_KEPT;
        s->kept_pass = h->decay_pass;
        s->kept_seq = ++h->keep_seq;
        list_append(&h->kept[s->cls], s);
        /* Its decay passes retire it if nothing takes it (see
           gsi_heap_retire_idle_kept): the clock starts with the first. */
        gsi_heap_decay_start(h);
        /* The empty-slab budget shares its refault boost with the own
           keeps: it fell, and no slab retires to trim the segments down
           to it (a review: threads that emptied slabs into their keeps
           after the last retirement left 95 MiB committed where 64 may
           stay). (Retirement takes the same lock.) */
        if (own && gsi_segments_budget_boost())
            gsi_segments_trim();
        return;
    }
    retire_owned(h, s);
}

/* Kept empty slabs that no refill took for a whole decay period
   (GRACESLAB_DECAY_MS) go back to their segments, which give the pages
   back after the purge delay. The keep is for a thread that frees and
   allocates again in batches; a thread that frees what others allocate,
   or whose active slab lives on the remote frees others make into it,
   empties slabs it never refills from, and kept them until it exited:
   a pool of 16 threads freeing each other's small blocks kept 268 of
   them, 17 MB for 6 MB live. Retired at the second pass after they were
   kept: one to two periods at the soonest, as passes come only with the
   heap's slow paths. Refill takes the oldest first. */
void gsi_heap_retire_idle_kept(struct gs_heap *h)
{
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        struct gs_slab *s;
        while ((s = h->kept[c].first) && h->decay_pass - s->kept_pass >= 2)
            retire_owned(h, s);
    }
}

size_t gsi_heap_trim(struct gs_heap *h)
{
    size_t bytes = 0;
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        struct gs_slab *next;
        for (struct gs_slab *s = h->kept[c].first; s; s = next) {
            next = s->next;
            bytes += (size_t)s->span * GS_SLOT_SIZE;
            retire_owned(h, s);
        }
    }
    return bytes;
}

/* A sweep reclaimed pending objects of s, which h owns and keeps on one of
   its lists: an emptied slab goes back to its segment, a waiting slab that
   now has free objects becomes partial. */
void gsi_heap_slab_reclaimed(struct gs_heap *h, struct gs_slab *s)
{
    if (s->where == GS_IN_ACTIVE)
        return;
    if (s->used == 0) {
        gsi_heap_slab_empty(h, s);
        return;
    }
    /* A parked slab, unparked for the reclaim, from which it got nothing
       (another sweep had handed its chain to the remote chain): still
       exhausted, so parked again, or the owner's frees into it would stay
       on the fast path, unseen until refill's turn came to it. */
    if (s->where == GS_IN_FULL && s->cls >= GS_FIRST_MEDIUM_CLASS &&
        s->free_head == GS_LINK_END) {
        park(s);
        return;
    }
    if ((s->where == GS_IN_WAITING || s->where == GS_IN_FULL) && s->free_head != GS_LINK_END) {
        unlink_owned(h, s);
        make_partial(h, s);
    }
}

/* h adopted s in gs_free_rcu(): it waits for its grace period on h's
   waiting list. */
void gsi_heap_wait_pending(struct gs_heap *h, struct gs_slab *s)
{
    s->wait_cookie = gsi_slab_pending_cookie(s);
    s->where = GS_IN_WAITING;
    list_append(&h->waiting[s->cls], s);
}

static void abandon_slab(struct gs_heap *h, struct gs_slab *s);

/* h adopted the ownerless slab s outside its lists (a sweep, which may run
   on the engine's lazy thread, a thread that never allocates): retire it if
   empty, else hand it back to the orphan list, where allocating heaps of its
   class adopt it. */
void gsi_heap_settle_adopted(struct gs_heap *h, struct gs_slab *s)
{
    abandon_slab(h, s);
}

static void sum_pending(struct gs_heap *h, void *arg)
{
    struct { int64_t *per_class; uint64_t *reclaimed; } *acc = arg;
    for (unsigned c = 0; c < GS_NCLASSES; c++)
        acc->per_class[c] += atomic_load_explicit(&h->pending_objects[c], memory_order_relaxed);
    *acc->reclaimed += atomic_load_explicit(&h->reclaimed_objects, memory_order_relaxed);
}

void gsi_heaps_pending(int64_t *per_class, uint64_t *reclaimed)
{
    struct { int64_t *per_class; uint64_t *reclaimed; } acc = {per_class, reclaimed};
    gsi_heaps_foreach(sum_pending, &acc);
}

/* Partial slabs of a class a heap keeps when it takes one over by freeing
   into it (see gsi_heap_take_adopted). */
#define GS_TAKEOVER_PARTIAL 2
/* Sheds a heap may make per class after it saw a refill elsewhere look
   for an orphan or a new slab of the class (class_demand). */
#define GS_SHED_CREDIT 1024

void gsi_heap_take_adopted(struct gs_heap *h, struct gs_slab *s)
{
    /* Read after the adopting CAS (acquire), which the releaser's CAS
       published it to. */
    if (s->released_by == h->id && !h->keep_full && ++h->self_adopts >= GS_KEEP_FULL_AFTER)
        h->keep_full = true;
    gsi_orphan_remove(s);
    gsi_slab_collect(s);
    make_partial(h, s);
    poll_partial(h, s->cls);
    /* Takeovers keep the holes a heap's frees make where only it can reuse
       them, at the rate it allocates the class, if at all. A thread that
       frees the blocks another replaces, some of them long-lived, left the
       allocating thread making new slabs while the old ones stayed partly
       used for good (16.5 MB live, 119 MB peak RSS; jemalloc 46 MB,
       mimalloc 44); a pool whose 12 workers free the producers' blocks
       and allocate fewer of their own held about 3.5 slabs per class and
       worker, most of their objects freed onto remote chains the workers
       had not reached (6.6 MB live, 92 MB; jemalloc 28). So beyond a
       couple, the slab looked at longest ago goes to the orphan list,
       where the allocating heaps' refills take it (and its chain) before
       they make a new one. Only while someone needs them: after a refill
       somewhere used up a slab of the class or looked for an orphan or a
       new one (class_demand changed), a heap may shed GS_SHED_CREDIT
       slabs of it.
       Shedding with nobody to adopt made a thread that frees, in a random
       order, the million blocks another built and keeps take over a slab
       and shed another on nearly every free, 5.6 times slower (a review's
       program: 7.2 M frees/s against 40; one shed per refill elsewhere
       kept 61 MB of the table-and-freer case's 27). Not when a heap takes
       back a slab it released itself (a thread freeing its own blocks:
       those go back to it, and its decay passes see them), and a slab shed
       here is released as nobody's, so that the heap taking it back by a
       free, even this one, sheds again. */
    struct gs_slab_list *l = &h->partial[s->cls];
    if (s->released_by != h->id && l->count > GS_TAKEOVER_PARTIAL && l->last != s) {
        uint32_t demand = atomic_load_explicit(&class_demand[s->cls], memory_order_relaxed);
        if (demand != h->demand_seen[s->cls]) {
            h->demand_seen[s->cls] = demand;
            h->shed_credit[s->cls] = GS_SHED_CREDIT;
        }
        if (h->shed_credit[s->cls]) {
            h->shed_credit[s->cls]--;
            give_up_slab(h, l->last, GIVE_UP_SHED);
        }
    }
}

size_t gsi_heap_trim_orphans(struct gs_heap *h)
{
    size_t before = atomic_load_explicit(&gsi_orphan_free_bytes, memory_order_relaxed);
    /* Bounded: other threads may orphan slabs meanwhile. */
    for (int i = 0; i < 100000 && orphan_evict(h); i++)
        ;
    size_t after = atomic_load_explicit(&gsi_orphan_free_bytes, memory_order_relaxed);
    return before > after ? before - after : 0;
}

/* ------------------------------------------------------------ abandonment */

static void abandon_slab(struct gs_heap *h, struct gs_slab *s)
{
    give_up_slab(h, s, GIVE_UP_ABANDON);
}

static void give_up_slab(struct gs_heap *h, struct gs_slab *s, enum give_up why)
{
    unlink_owned(h, s);
    /* An orphan adopted without leaving its list (gs_free_rcu, sweeps)
       leaves it now: its entry's count is out of date, and a listed slab
       is not listed again (gsi_orphan_push). */
    gsi_orphan_remove(s);
    bool useful;
    uint32_t committed_free = 0;
    for (;;) {
        gsi_slab_collect(s);
        if (s->used == 0 && !gsi_slab_has_pending(s)) {
            gsi_slab_retire(s); /* unlisted above; owned, so not listed since */
            return;
        }
        /* Read while still the owner: after the release below the slab
           may be adopted and its owner fields are someone else's. */
        useful = s->free_head != GS_LINK_END || s->bump < s->capacity;
        if (s->free_head != GS_LINK_END)
            committed_free = orphan_keep(h, s, why);
        if (gsi_slab_release_as(h, s, why == GIVE_UP_SHED ? 0 : h->id))
            break;
    }
    if (useful || gsi_slab_has_pending(s))
        gsi_orphan_push(s, committed_free);
}

static void heap_abandon(struct gs_heap *h)
{
    gsi_remote_flush(h);
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        struct gs_slab *s;
        if ((s = h->active[c]) != &gsi_empty_slab)
            abandon_slab(h, s);
        while ((s = h->partial[c].first))
            abandon_slab(h, s);
        while ((s = h->kept[c].first))
            abandon_slab(h, s);
        while ((s = h->waiting[c].first))
            abandon_slab(h, s);
        while ((s = h->full[c].first))
            abandon_slab(h, s);
    }
    h->keep_full = false;
    h->self_adopts = 0;
    if (h->slabs_made >= GS_HEAP_CLAIM_AFTER)
        gsi_segments_disown(h->id);
    h->slabs_made = 0;
    if (h == gsi_tls_mine)
        gsi_tls_heap = gsi_tls_mine = &gsi_empty_heap;
    pthread_mutex_lock(&heap_lock);
    h->live = false;
    h->next_pool = heap_pool;
    heap_pool = h;
    pthread_mutex_unlock(&heap_lock);
}

/* ------------------------------------------------------------------- fork */

static struct gs_heap *heap_by_id(uint32_t id)
{
    for (struct gs_heap *h = heap_all; h; h = h->next_all)
        if (h->id == id)
            return h;
    return NULL;
}

/* Fork child: the slabs of the lost threads' heaps, whose lists the child
   forgets (atfork_child), and slabs fork caught between two owners.
   - Owned by a lost heap (h->lost): every slab it listed, and any it had
     on no list (fork came between an adoption CAS and the list, or between
     taking a slab off a list and putting it back). Left so, such a slab
     would stay owned by a pooled heap's id (the next user of that heap
     struct would find its own id on a slab it does not hold) and keyed by
     a thread pointer the child may hand to a new thread: it is released
     and listed as an orphan.
   - Ownerless, no orphan, nothing allocated: made by gsi_slab_new for a
     lost thread that had not taken it yet (a released slab holds allocated
     objects; an empty one is retired or listed). Nobody would ever free
     into it: it is retired. */
struct unlisted {
    struct gs_slab *owned; /* owned by a lost heap, on none of its lists */
    struct gs_slab *fresh; /* made for a lost thread, not yet taken */
};

static void collect_unlisted(struct gs_slab *s, void *arg)
{
    struct unlisted *u = arg;
    uint32_t id = GS_X_OWNER(atomic_load_explicit(&s->xstate, memory_order_relaxed));
    struct gs_heap *owner = id ? heap_by_id(id) : NULL;
    if (owner && owner->lost) {
        s->next = u->owned; /* on no heap list: the link is free */
        u->owned = s;
    } else if (!id && !s->orphaned && !s->cache && s->used == 0 && !gsi_slab_has_pending(s)) {
        s->next = u->fresh; /* see struct unlisted */
        u->fresh = s;
    }
}

/* Fork child: repairs what fork caught half done in a lost owner's slab.
   The child sees each lost thread's stores up to some point (a thread
   stops at its first store to a page fork already copied), so only these
   splits of the owner's own updates remain:
   - gsi_slab_set_head: free_head written, free_ptr not yet;
   - gsi_slab_extend: the new objects linked and made the list head, bump
     not yet advanced. They were never handed out, but counted against the
     old bump the slab looked emptier than it is (a recount of 0 with live
     objects), and the next extend would have linked them a second time
     (two owners for one object).
   Other splits only lose objects for the child (never reused), never hand
   one out twice. */
static void repair_torn_slab(struct gs_slab *s)
{
    gsi_slab_set_head(s, s->free_head);
    uint32_t n = 0;
    for (uint32_t i = (uint32_t)s->free_head; i != GS_LINK_END && n < s->capacity; n++) {
        if (i >= s->bump)
            s->bump = i + 1;
        i = gsi_link_load(s, i) & GS_LINK_INDEX;
    }
}

static void rescue_unlisted_slabs(void)
{
    struct unlisted u = {NULL, NULL};
    gsi_segments_foreach(collect_unlisted, &u);
    while (u.fresh) {
        struct gs_slab *s = u.fresh;
        u.fresh = s->next;
        s->next = NULL;
        gsi_slab_retire(s);
    }
    struct gs_slab *list = u.owned;
    while (list) {
        struct gs_slab *s = list;
        list = s->next;
        s->next = NULL;
        struct gs_heap *owner =
            heap_by_id(GS_X_OWNER(atomic_load_explicit(&s->xstate, memory_order_relaxed)));
        s->where = GS_IN_NONE;
        s->prev = NULL;        /* a stale link of a list the child forgot */
        if (s->kept_empty) /* its lost heap's count was reset; the totals were not */
            keep_drop(NULL, s);
        repair_torn_slab(s); /* every slab here is a lost heap's */
        /* Whatever charge or watch it had (active, parked): the recount
           includes the remote chain, which the collect then takes off. */
        s->used = gsi_slab_recount(s);
        gsi_slab_collect(s);
        gsi_slab_release(owner, s);    /* no other thread: the chain is empty */
        gsi_orphan_push(s, 0);
    }
}

/* Every dedicated cache's lock. Order: cache_locks_lock, each cache's
   lock, then the fork gate and the allocator's locks (atfork_prepare): a
   thread holding a cache's lock may enter the gate (reclaiming) and take
   the slab locks, and no gated operation takes a cache's lock. */
static pthread_mutex_t cache_locks_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gs_cache_lock *cache_locks;

void gsi_cache_lock_register(struct gs_cache_lock *l)
{
    pthread_mutex_lock(&cache_locks_lock);
    l->prev = NULL;
    l->next = cache_locks;
    if (cache_locks)
        cache_locks->prev = l;
    cache_locks = l;
    pthread_mutex_unlock(&cache_locks_lock);
}

void gsi_cache_lock_unregister(struct gs_cache_lock *l)
{
    pthread_mutex_lock(&cache_locks_lock);
    if (l->prev)
        l->prev->next = l->next;
    else
        cache_locks = l->next;
    if (l->next)
        l->next->prev = l->prev;
    pthread_mutex_unlock(&cache_locks_lock);
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&cache_locks_lock);
    for (struct gs_cache_lock *l = cache_locks; l; l = l->next)
        pthread_mutex_lock(&l->mutex);
    gsi_pending_fork_prepare();
    pthread_mutex_lock(&heap_lock);
    for (unsigned c = 0; c < GS_NCLASSES; c++)
        pthread_mutex_lock(&orphans[c].lock);
    gsi_segments_lock();
    gsi_large_atfork_prepare();
    gsi_vg_atfork_prepare();
}

static void atfork_parent(void)
{
    gsi_vg_atfork_parent();
    gsi_large_atfork_parent();
    gsi_segments_unlock();
    for (unsigned c = 0; c < GS_NCLASSES; c++)
        pthread_mutex_unlock(&orphans[c].lock);
    pthread_mutex_unlock(&heap_lock);
    gsi_pending_fork_done();
    for (struct gs_cache_lock *l = cache_locks; l; l = l->next)
        pthread_mutex_unlock(&l->mutex);
    pthread_mutex_unlock(&cache_locks_lock);
}

static void atfork_child(void)
{
    /* Every lock below was taken by this thread in atfork_prepare: unlock
       (re-initialising a locked mutex also works, but ThreadSanitizer then
       takes it for locked still, and reports the next fork's lock as a
       double lock). */
    for (struct gs_cache_lock *l = cache_locks; l; l = l->next)
        pthread_mutex_unlock(&l->mutex);
    pthread_mutex_unlock(&cache_locks_lock);
    gsi_vg_atfork_child();
    gsi_large_atfork_child();
    gsi_segments_atfork_child();
    for (unsigned c = 0; c < GS_NCLASSES; c++)
        pthread_mutex_unlock(&orphans[c].lock);
    pthread_mutex_unlock(&heap_lock);
    /* The other threads are gone: their heaps have no thread any more.
       Abandon them so their free objects can be adopted.
       Their lists are forgotten, not walked. A lost thread was running
       while fork copied memory, and it vanished at its first store to a
       page fork had already copied (that store faults and waits for the
       fork to end): between any two stores of an owner-only update, e.g.
       gsi_heap_list_remove() of a list's first slab after `l->first =
       s->next` (heap page) but before `s->next->prev = NULL` (segment
       header, copied earlier). abandon_slab() of that next slab then leaves
       it first on the list (its stale prev makes the removal skip
       l->first), and the loop below abandons it again: it is retired or
       released twice (assertions `s->kind == GS_SLAB_SMALL` in
       gsi_slab_retire, owner == h->id in gsi_slab_release). Only the owner
       id in xstate, changed by CAS alone, says which slabs a lost heap
       owns: rescue_unlisted_slabs() finds each of them by it, whatever
       list it was on. (heap_abandon still flushes the heap's remote batch;
       a slab that flush adopts goes on the emptied, consistent lists.) */
    struct gs_heap *me = gsi_tls_mine;
    for (struct gs_heap *h = heap_all; h; h = h->next_all)
        if (h->live && h != me) {
            h->lost = true;
            heap_clear_active(h);
            memset(h->partial, 0, sizeof h->partial);
            memset(h->kept, 0, sizeof h->kept);
            memset(h->waiting, 0, sizeof h->waiting);
            memset(h->full, 0, sizeof h->full);
            h->empty_bytes = 0;
            heap_abandon(h);
        }
    rescue_unlisted_slabs();
    for (struct gs_heap *h = heap_all; h; h = h->next_all)
        h->lost = false;
    gsi_pending_fork_done();
}

/*
 * A process that never started a thread (glibc's __libc_single_threaded)
 * forks without them, as glibc forks without its own malloc's locks then:
 * fork is async-signal-safe there, and a signal handler that forks may have
 * interrupted this very thread inside the allocator, holding the lock
 * prepare would wait for (found with a glibc tst-mallocfork2-style test:
 * a handler's fork hung at once on segment_lock, held by the slab
 * formatting it interrupted). With one thread no other holds a lock or
 * leaves an update half done, so there is nothing to take in prepare and
 * nothing to repair in the child: the interrupted operation, if any, goes
 * on in both processes when the handler returns. The child redoes only
 * what belongs to the new process. Decided in prepare, for the other two
 * (the child must not re-read the flag, which glibc may reset there).
 * Relaxed: written and read by the forking thread; concurrent forks of a
 * threaded process only ever store false.
 */
static _Atomic bool fork_alone;

/*
 * glibc's stdio list lock, taken before the allocator's locks. glibc's fork
 * takes it itself, but only after every prepare handler has run, and then
 * its own malloc's locks: "this needs to come last because [...] the libio
 * list lock has an indirect malloc dependency (via getdelim)". A thread in
 * fflush(NULL) holds the list lock and waits for each stream's lock; a
 * thread in getline holds its stream's lock and mallocs. Had prepare taken
 * the allocator's locks first, fork would wait for the list lock, the
 * flush for the stream, and getline's malloc for the allocator's locks held
 * by fork: a deadlock (glibc's tst-malloc-fork-deadlock scenario; jemalloc
 * and tcmalloc hang there too). Taken first, the order is glibc's: list
 * lock, then allocator. The lock is recursive (fork's own take nests
 * inside ours); in the parent glibc releases its take before the parent
 * handlers run, so fork_parent releases ours; in the child glibc
 * re-initialises it before the child handlers run (glibc 2.34+: both when
 * __libc_single_threaded is false, the same test as fork_alone's). Exported
 * by libc.so.6 (GLIBC_2.2.5) but declared in no public header.
 */
extern void _IO_list_lock(void);
extern void _IO_list_unlock(void);

/* The allocator's and the RCU engine's fork handlers as one triple, so
   that their locks are taken in one order whichever registered first: the
   allocator's first, then the engine's (cb_take_mutex, the registry lock),
   released in reverse. The other order deadlocks: a dedicated cache's
   refill holds its cache lock while it nudges the grace-period engine,
   which takes the registry lock, while a fork holding the registry lock
   waits for that cache lock (found in the thirteenth session's review,
   with a library whose constructor allocated before graceslab's own ran:
   then the engine's handlers had registered last and ran first; test
   stress/fork_early_malloc). Registered once, by gsi_heap_init_once,
   which runs at load time (below), at the first allocation or at the
   first pthread_atfork of anyone (alloc/atfork.c), whichever comes first,
   and so before the program can start a thread (glibc runs in a fork
   child only the handlers that existed when the fork began) and before
   any other fork handler. */

static void fork_prepare(void)
{
    bool alone = __libc_single_threaded;
    atomic_store_explicit(&fork_alone, alone, memory_order_relaxed);
    if (alone)
        return;
    _IO_list_lock();
    atfork_prepare();
    gsi_rcu_atfork_prepare();
}

static void fork_parent(void)
{
    if (atomic_load_explicit(&fork_alone, memory_order_relaxed))
        return;
    gsi_rcu_atfork_parent();
    atfork_parent();
    _IO_list_unlock();
}

static void fork_child(void)
{
    if (atomic_load_explicit(&fork_alone, memory_order_relaxed)) {
        gsi_rcu_atfork_child_alone();
        return;
    }
    gsi_rcu_atfork_child();
    atfork_child();
}

__attribute__((constructor)) static void init_at_load(void)
{
    gsi_heap_init_once();
}
