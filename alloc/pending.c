/*
 * RCU-deferred free inside the slab: gs_free_rcu() and the reclaim of
 * pending objects.
 *
 * The idea SLUB could not have (its free list lives inside the objects,
 * which readers may still be reading): graceslab's per-object state is out
 * of band, so deferring a free is only a change of that state.
 *
 *   gs_free_rcu(p): CAS p's link ALLOCATED -> PENDING|next and push p onto
 *   one of its slab's four pending chains, whose word (GS_P_*) holds the
 *   chain head, its length and the grace-period cookie the whole chain waits
 *   for (the maximum of its members' cookies). Lock-free, O(1), from any
 *   thread, no allocation, no system call; p's bytes are never written.
 *   The chain is chosen by the cookie ((cookie >> 1) & 3): cookies still
 *   waiting are at most two consecutive values, so two threads rarely merge
 *   a young cookie into an old chain — and if they do, the old members only
 *   wait longer, never less.
 *
 *   Reclaim: whoever takes a chain (CAS to empty) after gsi_gp_done(its
 *   cookie) owns every member: each was pushed by a CAS that the taking CAS
 *   read, so each member's cookie is <= the chain cookie, which is done.
 *   The owner heap turns the members into free objects of its local list
 *   (heap refill, bulk: one walk, no per-object atomics). Another thread
 *   (gs_reclaim, the engine's lazy hook, OOM) hands them to the owner through
 *   the slab's remote chain, or adopts an ownerless slab and frees them.
 *
 * Nothing here waits for a grace period except gs_reclaim() and the OOM
 * path outside read-side critical sections (gsi_gp_wait aborts inside).
 * Inside a read-side critical section every path only polls.
 *
 * Exact accounting: every pending object is on exactly one chain and its
 * size is its slab's class size, so the bytes a reclaim frees are counted,
 * not estimated.
 */
#include "alloc/internal.h"
#include "rcu/internal.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

/* Pending counts of threads that have no heap (yet). */
static _Atomic int64_t orphan_pending[GS_NCLASSES];
static _Atomic uint64_t orphan_reclaimed;
/* Large blocks pending a grace period: a lock-free stack (push: CAS;
   reclaim: exchange the whole stack). */
static _Atomic(struct gs_large *) large_pending;
static _Atomic int64_t large_pending_objects, large_pending_bytes;
static _Atomic bool hook_registered;
/* Set by the first deferral of a small object: until then no refill looks
   at other threads' pending counts. */
static _Atomic bool deferred_ever;
/* Set by gs_free_rcu (which makes no system call) when the engine may not
   know about new pending memory; the next allocator slow path kicks the
   lazy reclaim. Written only when it changes, so the shared line stays
   read-mostly. */
_Atomic bool gsi_pending_unarmed;

static void pending_hook(void);
struct sweep;
struct sweep *gsi_sweep_buffer(void);
static size_t run_sweep(size_t *still_pending, int only_cls);
void gsi_pending_stats_counts(struct gs_stats *st);

/* ------------------------------------------------------------- accounting */

/* Adds delta to the calling thread's pending count for class cls. Single
   writer per heap: load + store, relaxed (gs_stats_get sums racily). */
static void count_pending(unsigned cls, int64_t delta)
{
    if (!GS_STATS)
        return; /* -Dstats=false: no pending figures in gs_stats_get */
    struct gs_heap *h = gsi_tls_mine;
    if (h != &gsi_empty_heap) {
        int64_t v = atomic_load_explicit(&h->pending_objects[cls], memory_order_relaxed);
        atomic_store_explicit(&h->pending_objects[cls], v + delta, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&orphan_pending[cls], delta, memory_order_relaxed);
    }
}

static void count_reclaimed(uint64_t n)
{
    if (!GS_STATS)
        return;
    struct gs_heap *h = gsi_tls_mine;
    if (h != &gsi_empty_heap) {
        uint64_t v = atomic_load_explicit(&h->reclaimed_objects, memory_order_relaxed);
        atomic_store_explicit(&h->reclaimed_objects, v + n, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&orphan_reclaimed, n, memory_order_relaxed);
    }
}

/* ------------------------------------------------------------ fork gate */

/* A fork must not catch a deferred-free operation half done (a pushed but
   uncounted object, a chain taken but not yet relinked): the child would
   lose those objects. Each operation runs inside the gate; fork's prepare
   closes the gate and waits until no operation is inside.
   Thread side: flag = 1, seq_cst fence, load the gate. Fork side: gate = 1,
   seq_cst fence, load the flags. The two fences pair (store-buffering
   pattern): either the fork sees the flag and waits, or the thread sees
   the closed gate and steps back out. Operations of threads that have no
   heap count in gate_others. Uncontended cost: two stores, a fence, a load. */
static _Atomic bool fork_gate;
static _Atomic long gate_others;
static __thread unsigned gate_depth; /* a sweep reclaims inside its gate */

/* Enters the gate. With cookie != NULL, the seq_cst fence the protocol
   needs is the one inside gsi_gp_cookie() (it orders the flag store before
   the gate load just the same), and *cookie receives its result: one fence
   per gs_free_rcu, not two. */
static _Atomic int *gate_enter_cookie(uint64_t *cookie)
{
    if (gate_depth++) {
        /* Already inside: the outer enter covers this (and gate_leave
           returns before looking at the flag). */
        if (cookie)
            *cookie = gsi_gp_cookie();
        return NULL;
    }
    struct gs_heap *h = gsi_tls_mine;
    _Atomic int *flag = h != &gsi_empty_heap ? &h->defer_busy : NULL;
    for (;;) {
        if (flag)
            atomic_store_explicit(flag, 1, memory_order_relaxed);
        else
            atomic_fetch_add_explicit(&gate_others, 1, memory_order_relaxed);
        if (cookie)
            *cookie = gsi_gp_cookie(); /* seq_cst fence, then the sequence */
        else
            atomic_thread_fence(memory_order_seq_cst);
        if (GS_LIKELY(!atomic_load_explicit(&fork_gate, memory_order_relaxed)))
            return flag;
        if (flag)
            atomic_store_explicit(flag, 0, memory_order_release);
        else
            atomic_fetch_sub_explicit(&gate_others, 1, memory_order_release);
        while (atomic_load_explicit(&fork_gate, memory_order_acquire))
            sched_yield(); /* only while another thread forks */
    }
}

static _Atomic int *gate_enter(void)
{
    return gate_enter_cookie(NULL);
}

static void gate_leave(_Atomic int *flag)
{
    if (--gate_depth)
        return;
    /* Release: the operation's writes happen before fork sees it done. */
    if (flag)
        atomic_store_explicit(flag, 0, memory_order_release);
    else
        atomic_fetch_sub_explicit(&gate_others, 1, memory_order_release);
}

static void wait_not_busy(struct gs_heap *h, void *arg)
{
    (void)arg;
    while (atomic_load_explicit(&h->defer_busy, memory_order_acquire))
        sched_yield();
}

void gsi_pending_fork_prepare(void)
{
    atomic_store_explicit(&fork_gate, true, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst); /* pairs with gate_enter's fence */
    while (atomic_load_explicit(&gate_others, memory_order_acquire))
        sched_yield();
    gsi_heaps_foreach(wait_not_busy, NULL);
}

void gsi_pending_fork_done(void)
{
    atomic_store_explicit(&fork_gate, false, memory_order_release);
}

/* ---------------------------------------------------------------- cookies */

/* A chain word keeps the low 40 bits of its cookie (GS_P_COOKIE); the
   sequence is 64-bit. Every cookie still waiting is at most the sequence
   + 3 (gsi_gp_cookie) and the sequence only grows, so the full cookie is
   the one with those low bits in (seq + 4 - 2^40, seq + 4]. Taken as is,
   once the sequence passed 2^40 (2^39 grace periods: about a day of
   back-to-back gs_synchronize_rcu) a truncated cookie read as long done and
   deferred objects were reused under readers. A cookie older than the
   window (a chain left 2^39 grace periods unswept) comes back as a later
   one: it only waits longer. */
#define COOKIE_SPAN ((uint64_t)1 << 40)
static uint64_t chain_cookie(uint64_t w)
{
    uint64_t top = atomic_load_explicit(&gsi_gp_seq, memory_order_relaxed) + 4;
    uint64_t c = (top & ~(COOKIE_SPAN - 1)) | GS_P_COOKIE(w);
    if (c > top && c >= COOKIE_SPAN)
        c -= COOKIE_SPAN;
    return c;
}

/* The newer of a chain's cookie and `cookie`, without reading the
   sequence (gs_free_rcu's path): two cookies still waiting are within a few
   of each other, so the signed difference of their low 40 bits is their
   difference. (A chain cookie 2^39 grace periods stale may come out as the
   newer one: its chain only waits longer.) */
static uint64_t newer_cookie(uint64_t w, uint64_t cookie)
{
    int64_t d = (int64_t)((GS_P_COOKIE(w) - cookie) << 24) >> 24;
    return d > 0 ? cookie + (uint64_t)d : cookie;
}

/* ------------------------------------------------------------ gs_free_rcu */

static void free_rcu_small(void *p, const char *call, uint64_t cookie)
{
    uint32_t idx;
    struct gs_slab *s = gsi_small_block(p, &idx, call);
    unsigned cls = s->cls;
    /* A full slab has no owner to reclaim it: a caller that allocates this
       class adopts it (one CAS, lock-free) and keeps it on its waiting
       list, so its own refills reclaim the object. Its orphan-list entry,
       if any, stays as a stale hint (see gsi_orphan_remove). A caller that
       does not allocate this class leaves it ownerless: a sweep adopts it
       once the grace period is done and hands it to the orphan list, where
       the heaps that allocate the class find it. (Adopted by such a caller,
       the reclaimed objects waited on its remote chains for refills that
       never came, and a thread that allocated for another thread that
       deferred the frees mapped new memory without bound.) Nor does a
       caller that already holds GRACESLAB_PENDING_EXPEDITE_KB of the class
       waiting: one that allocates the class only now and then refills
       rarely, so the slabs it adopted waited for it, full of reclaimable
       objects, while the thread that allocated them mapped new ones
       (found in the thirteenth session's review: 3.5 GB mapped for 64 KiB
       live; test pending_membound/consumer_allocating_a_little).
       Adopted before the push, and s not read after it unless adopted:
       once the object is on a chain, a grace period and another thread's
       sweep can reclaim it, and the slab can empty, be retired, even be
       unmapped with its segment, while this thread is preempted. */
    struct gs_heap *h = gsi_tls_mine;
    bool adopted = GS_X_OWNER(atomic_load_explicit(&s->xstate, memory_order_relaxed)) == 0 &&
                   h != &gsi_empty_heap && !s->cache && h->active[cls] != &gsi_empty_slab &&
                   !gsi_heap_pending_worth_waiting(h, cls) && gsi_slab_adopt(h, s);
    _Atomic uint64_t *chain = &s->pending[(cookie >> 1) & (GS_PENDING_CHAINS - 1)];
    uint64_t w = atomic_load_explicit(chain, memory_order_relaxed);
    bool marked = false;
    for (;;) {
        uint16_t link = (uint16_t)(GS_LINK_PENDING | GS_P_HEAD(w));
        if (!marked) {
            /* State check and claim in one CAS: a second gs_free_rcu or a
               racing free of the same object cannot both succeed. */
            uint16_t expect = GS_LINK_ALLOCATED;
            if (!__atomic_compare_exchange_n(&s->link[idx], &expect, link, false,
                                             __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                gsi_bad_free(call, p, expect);
            marked = true;
        } else {
            gsi_link_store(s, idx, link);
        }
        uint64_t c = GS_P_COUNT(w) ? newer_cookie(w, cookie) : cookie;
        /* Release: publishes the link write to the reclaimer's acquire CAS
           in take_done_chain(). */
        if (atomic_compare_exchange_weak_explicit(chain, &w,
                                                  GS_P_MAKE(c, idx, GS_P_COUNT(w) + 1),
                                                  memory_order_release, memory_order_relaxed))
            break;
    }
    count_pending(cls, 1);
    if (!atomic_load_explicit(&deferred_ever, memory_order_relaxed))
        atomic_store_explicit(&deferred_ever, true, memory_order_relaxed);
    if (adopted)
        gsi_heap_wait_pending(h, s); /* ours: nobody else retires it */
    if (!atomic_load_explicit(&gsi_pending_unarmed, memory_order_relaxed))
        atomic_store_explicit(&gsi_pending_unarmed, true, memory_order_relaxed);
}

static void free_rcu_large(void *p, const char *call, uint64_t cookie)
{
    struct gs_large *b = gsi_large_of(p);
    if (!b || b->user != p || b->magic != GS_LARGE_MAGIC)
        gsi_fatal(call, "invalid pointer (not a live graceslab block)", p);
    uint32_t expect = GS_LARGE_LIVE;
    if (!atomic_compare_exchange_strong_explicit(&b->state, &expect, GS_LARGE_PENDING,
                                                 memory_order_relaxed, memory_order_relaxed))
        gsi_fatal(call, "object already freed with gs_free_rcu(), pending a grace period:", p);
    b->cookie = cookie;
    /* Counted before the push: once b is on the stack a reclaimer may free
       it, and b must not be read any more. */
    atomic_fetch_add_explicit(&large_pending_objects, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&large_pending_bytes, (int64_t)b->usable, memory_order_relaxed);
    b->next = atomic_load_explicit(&large_pending, memory_order_relaxed);
    /* Release: b's cookie and next are visible to the reclaimer's acquire
       exchange. */
    while (!atomic_compare_exchange_weak_explicit(&large_pending, &b->next, b,
                                                  memory_order_release, memory_order_relaxed))
        ;
    if (!atomic_load_explicit(&gsi_pending_unarmed, memory_order_relaxed))
        atomic_store_explicit(&gsi_pending_unarmed, true, memory_order_relaxed);
}

void gsi_free_rcu(void *p, const char *call)
{
    if (!p)
        return;
    unsigned kind = gsi_map_kind((uintptr_t)p);
    if (GS_UNLIKELY(kind != GS_MAP_SMALL && kind < GS_MAP_LARGE))
        gsi_fatal(call, "invalid pointer (not allocated by graceslab)", p);
    uint64_t cookie;
    _Atomic int *gate = gate_enter_cookie(&cookie);
    if (GS_LIKELY(kind == GS_MAP_SMALL))
        free_rcu_small(p, call, cookie);
    else
        free_rcu_large(p, call, cookie);
    gate_leave(gate);
}

GS_EXPORT void gs_free_rcu(void *p)
{
    gsi_free_rcu(p, "gs_free_rcu");
}

/* ---------------------------------------------------------------- reclaim */

/* Takes chain k of s if its grace period is done; returns its word (count 0
   if nothing was taken). Acquire pairs with the pushers' release CAS. */
static uint64_t take_done_chain(struct gs_slab *s, unsigned k)
{
    uint64_t w = atomic_load_explicit(&s->pending[k], memory_order_relaxed);
    while (GS_P_COUNT(w) && gsi_gp_done(chain_cookie(w))) {
        if (atomic_compare_exchange_weak_explicit(&s->pending[k], &w,
                                                  GS_P_MAKE(GS_P_COOKIE(w), GS_LINK_END, 0),
                                                  memory_order_acquire, memory_order_relaxed))
            return w;
    }
    return GS_P_MAKE(0, GS_LINK_END, 0);
}

/* Rewrites the n links of a chain from PENDING to `tag` (0: local list,
   GS_LINK_REMOTE: remote chain); returns the tail index. */
static uint32_t retag_chain(struct gs_slab *s, uint32_t head, uint32_t n, uint16_t tag)
{
    uint32_t i = head;
    for (uint32_t k = 1;; k++) {
        uint16_t v = gsi_link_load(s, i);
        GS_ASSERT_EXPENSIVE((v & ~GS_LINK_INDEX) == GS_LINK_PENDING);
        gsi_link_store(s, i, (uint16_t)(tag | (v & GS_LINK_INDEX)));
        GS_VG_FREE(s->start + (size_t)i * s->obj_size); /* no-access from now on */
        if (s->typesafe) /* its readers may still look */
            GS_VG_TYPESAFE(s->start + (size_t)i * s->obj_size, s->obj_size);
        if (k == n)
            return i;
        i = v & GS_LINK_INDEX;
    }
}

static uint32_t counted_reclaim(const struct gs_slab *s, uint32_t n)
{
    if (n) {
        count_pending(s->cls, -(int64_t)n);
        count_reclaimed(n);
    }
    return n;
}

/* Takes done chain k of s and retags its links with tag; returns its
   length (0: nothing done there) and its head and tail. */
static uint32_t take_done_retagged(struct gs_slab *s, unsigned k, uint16_t tag, uint32_t *head,
                                   uint32_t *tail)
{
    uint64_t w = take_done_chain(s, k);
    uint32_t n = GS_P_COUNT(w);
    if (n) {
        *head = GS_P_HEAD(w);
        *tail = retag_chain(s, *head, n, tag);
    }
    return n;
}

uint32_t gsi_pending_reclaim_local(struct gs_slab *s)
{
    if (!gsi_slab_has_pending(s))
        return 0;
    _Atomic int *gate = gate_enter();
    uint32_t total = 0;
    for (unsigned k = 0; k < GS_PENDING_CHAINS; k++) {
        uint32_t head, tail, n = take_done_retagged(s, k, 0, &head, &tail);
        if (!n)
            continue;
        gsi_link_store(s, tail, (uint16_t)s->free_head);
        gsi_slab_set_head(s, head);
        GS_ASSERT(s->used >= n);
        s->used -= n;
        total += n;
    }
    gate_leave(gate);
    return counted_reclaim(s, total);
}

/* Not the owner: hands the done chains to the owner through the remote
   chain. Lock-free; safe under the segment lock. */
static uint32_t reclaim_to_remote(struct gs_slab *s)
{
    uint32_t total = 0;
    for (unsigned k = 0; k < GS_PENDING_CHAINS; k++) {
        uint32_t head, tail, n = take_done_retagged(s, k, GS_LINK_REMOTE, &head, &tail);
        if (!n)
            continue;
        uint64_t x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
        do {
            gsi_link_store(s, tail, (uint16_t)(GS_LINK_REMOTE | GS_X_HEAD(x)));
            /* Release: the retagged links are visible to the owner's acquire
               CAS in gsi_slab_collect() (as for a remote free). */
        } while (!atomic_compare_exchange_weak_explicit(
            &s->xstate, &x, GS_X_MAKE(GS_X_OWNER(x), head, GS_X_COUNT(x) + n),
            memory_order_release, memory_order_relaxed));
        total += n;
    }
    return counted_reclaim(s, total);
}

bool gsi_slab_has_pending(const struct gs_slab *s)
{
    for (unsigned k = 0; k < GS_PENDING_CHAINS; k++)
        if (GS_P_COUNT(atomic_load_explicit(&s->pending[k], memory_order_relaxed)))
            return true;
    return false;
}

/* The newest cookie among s's chains (what the whole slab waits for). */
uint64_t gsi_slab_pending_cookie(const struct gs_slab *s)
{
    uint64_t c = 0;
    for (unsigned k = 0; k < GS_PENDING_CHAINS; k++) {
        uint64_t w = atomic_load_explicit(&s->pending[k], memory_order_relaxed);
        uint64_t k_cookie = GS_P_COUNT(w) ? chain_cookie(w) : 0;
        if (k_cookie > c)
            c = k_cookie;
    }
    return c;
}

/* Sweeps in progress (gsi_pending_sweeps_quiesce): a slab sweep or a walk
   of the large stack holds chains or blocks it took and has not counted
   yet. */
static _Atomic int sweeps_running;

/* Large blocks: frees the ones whose grace period is done. */
static size_t reclaim_large(void)
{
    /* Counted before the take (seq_cst, as in gsi_pending_sweep): a
       gs_reclaim that finds the stack empty because we took it waits for
       us in gsi_pending_sweeps_quiesce. Its exchange reads ours (or a push
       after it, which continues our release sequence), so our increment
       happens before its look at the counter. */
    atomic_fetch_add(&sweeps_running, 1);
    /* Acquire: the pushers' cookies and links (their release CAS).
       Release: the increment above, for the next taker (see there). */
    struct gs_large *b = atomic_exchange_explicit(&large_pending, NULL, memory_order_acq_rel);
    size_t bytes = 0;
    while (b) {
        struct gs_large *next = b->next;
        if (gsi_gp_done(b->cookie)) {
            atomic_fetch_sub_explicit(&large_pending_objects, 1, memory_order_relaxed);
            atomic_fetch_sub_explicit(&large_pending_bytes, (int64_t)b->usable, memory_order_relaxed);
            bytes += b->usable;
            count_reclaimed(1);
            atomic_store_explicit(&b->state, GS_LARGE_LIVE, memory_order_relaxed);
            GS_VG_FREE(b->user);
            gsi_large_free(b, "gs_free_rcu");
        } else {
            b->next = atomic_load_explicit(&large_pending, memory_order_relaxed);
            while (!atomic_compare_exchange_weak_explicit(&large_pending, &b->next, b,
                                                          memory_order_release,
                                                          memory_order_relaxed))
                ;
        }
        b = next;
    }
    atomic_fetch_sub(&sweeps_running, 1);
    return bytes;
}

/* Large blocks have no slab refill: the large allocation path is their
   reclaim path. Frees the done ones; when more than the expedite bound is
   still pending, waits for a grace period first (inside a read-side
   critical section, bounded, and at the section's unlock when the grace
   period needed waits for the section: below), so deferred large frees
   cannot pile up. */
void gsi_pending_large_refill(void)
{
    if (!atomic_load_explicit(&large_pending, memory_order_relaxed))
        return;
    _Atomic int *gate = gate_enter();
    reclaim_large();
    gate_leave(gate);
    int64_t bytes = atomic_load_explicit(&large_pending_bytes, memory_order_relaxed);
    if (bytes <= (int64_t)gsi_pending_expedite_bytes())
        return;
    if (!gsi_gp_wait_or_expedite(gsi_gp_cookie())) {
        /* Inside a reader: wait, as a slab refill does (heap.c,
           waiting_ready), for the end of the grace period in progress
           (here if it does not wait for the caller, at the section's
           unlock if it does: gsi_gp_wait_in_reader), or with none in
           progress for the next one's end, at the unlock. Before,
           nothing slowed such writers when the grace periods did: 4
           writers of 320 KiB blocks inside sections on 2 CPUs peaked at
           270 to 440 MiB pending, once at 1.6 GiB against the test's 1.25
           GiB bound; waiting for the one in progress only, 100 to 210 MiB;
           with the next one's end left to the unlock, 3.2 to 3.6 MiB
           (pending_membound), at about 19,000 grace periods a second
           instead of 5,000 (alone), as outside readers, where every such
           allocation waits for one. Relaxed: only names it. */
        uint64_t seq = atomic_load_explicit(&gsi_gp_seq, memory_order_relaxed);
        if (!gsi_gp_wait_in_reader(seq & 1 ? seq + 1 : seq + 2, GS_READER_WAIT_NS, false))
            return;
    }
    gate = gate_enter();
    reclaim_large();
    gate_leave(gate);
}

/* ----------------------------------------- reclaim across every slab */

struct class_count {
    unsigned cls;
    int64_t n;
};

static void add_class_pending(struct gs_heap *h, void *arg)
{
    struct class_count *cc = arg;
    if (h != gsi_tls_mine)
        cc->n += atomic_load_explicit(&h->pending_objects[cc->cls], memory_order_relaxed);
}

/* Shortest time between two light sweeps (process-wide): each walks every
   slab under the segment lock. */
#define LIGHT_SWEEP_NS 10000000u
static _Atomic uint64_t light_sweep_last;

/* gsi_pending_reclaim_class() inside a reader, which cannot wait (the lazy
   thread drives the grace periods): what is done is swept now, at most once
   per LIGHT_SWEEP_NS in the process: only the class's ownerless slabs (a
   thread's deferrals of objects it does not allocate leave their slabs
   ownerless, and only a sweep hands them back) and the caller's own; other
   heaps' slabs are their owners' to reclaim. Before, this waited for the
   lazy sweep, about once a second: a thread allocating inside readers what
   another thread deferred mapped a second's worth of allocations. */
static bool light_sweep(unsigned cls)
{
    uint64_t now = gsi_now_ns(), last = atomic_load_explicit(&light_sweep_last, memory_order_relaxed);
    /* A hundredth of the period for the medium classes (above 32 KiB):
       10 ms of their allocations is a lot of memory. Four writers replacing
       64 KiB blocks inside readers (stress_pending_membound) held 170 to
       310 MiB pending with 10 ms, 150 to 190 MiB with 0.1 ms; with no
       limit at all, the sweeps contended for the segment lock (175 to
       320 MiB). */
    uint64_t period = gsi_classes[cls].size > GS_DIRECT_MAX ? LIGHT_SWEEP_NS / 100 : LIGHT_SWEEP_NS;
    /* Relaxed CAS: elects one sweeper per period; nothing else is ordered
       by it (the sweep has its own synchronisation). */
    if (now - last < period ||
        !atomic_compare_exchange_strong_explicit(&light_sweep_last, &last, now,
                                                 memory_order_relaxed, memory_order_relaxed))
        return false;
    return run_sweep(NULL, (int)cls) > 0;
}

bool gsi_pending_reclaim_class(unsigned cls)
{
    /* The per-heap counts exist only with statistics (-Dstats=false: no
       bound across threads, only the deferring thread's own). */
    if (!GS_STATS || !atomic_load_explicit(&deferred_ever, memory_order_relaxed))
        return false;
    /* Other heaps' counts only: this thread's own deferrals wait on its
       own lists, which refill has just waited for (gsi_heap_pending_worth_waiting).
       A count goes up in the deferring heap and down in the reclaiming
       one, so the others' sum is the class's pending total minus this
       heap's own balance: at least the total for a thread that only
       reclaims what others defer. */
    struct class_count cc = {cls, atomic_load_explicit(&orphan_pending[cls], memory_order_relaxed)};
    gsi_heaps_foreach(add_class_pending, &cc);
    if (cc.n <= 0 || (size_t)cc.n * gsi_classes[cls].size < gsi_pending_expedite_bytes())
        return false;
    if (!gsi_gp_wait_or_expedite(gsi_gp_cookie())) {
        /* The end of the grace period in progress (or of the last one, if
           none is: done). Relaxed: only names it. */
        uint64_t seq = atomic_load_explicit(&gsi_gp_seq, memory_order_relaxed);
        bool ended = gsi_gp_wait_in_reader((seq + 1) & ~(uint64_t)1, GS_READER_WAIT_NS, false);
        /* Also true once that grace period has ended, whoever's sweep
           followed it up: the caller looks at the orphan list again
           before mapping. */
        return light_sweep(cls) || ended;
    }
    return gsi_pending_sweep(NULL) > 0;
}

#define SETTLE_BATCH 1024

struct sweep {
    struct gs_heap *h;              /* the sweeping thread's heap (may be NULL) */
    int only_cls;                   /* -1: every slab; else a light sweep of
                                       that class: ownerless slabs and h's
                                       own, not other heaps' */
    size_t bytes;                   /* made reusable */
    bool full;                      /* settle[] filled up: sweep again */
    unsigned nsettle;
    struct gs_slab *settle[SETTLE_BATCH]; /* slabs owned by h, to finish
                                             after the segment lock */
};

static bool has_done_chain(const struct gs_slab *s)
{
    for (unsigned k = 0; k < GS_PENDING_CHAINS; k++) {
        uint64_t w = atomic_load_explicit(&s->pending[k], memory_order_relaxed);
        if (GS_P_COUNT(w) && gsi_gp_done(chain_cookie(w)))
            return true;
    }
    return false;
}

/* Under segment_lock: lock-free work only. Slabs of other heaps get their
   done chains through the remote chain; slabs h owns or adopts here are
   finished after the lock is dropped (nobody else may retire them). */
static bool adoptable(const struct sweep *sw, const struct gs_slab *s, uint64_t x)
{
    return GS_X_OWNER(x) == 0 && sw->h && !s->cache;
}

/* Takes s for sw's heap (adopting it if ownerless), to settle after the
   lock; false if the batch is full (sw->full: another pass) or another
   heap adopted it first. */
static bool take_for_settle(struct sweep *sw, struct gs_slab *s, uint64_t x)
{
    if (sw->nsettle == SETTLE_BATCH) {
        sw->full = true;
        return false;
    }
    if (GS_X_OWNER(x) == 0 && !gsi_slab_adopt(sw->h, s))
        return false;
    sw->settle[sw->nsettle++] = s;
    return true;
}

static void sweep_slab(struct gs_slab *s, void *arg)
{
    struct sweep *sw = arg;
    if (sw->only_cls >= 0 && s->cls != sw->only_cls)
        return;
    uint64_t x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
    /* Only slabs with a chain done now: a slab settled in an earlier pass
       whose objects still wait has nothing to do, and picking it again made
       a sweep with more than SETTLE_BATCH such slabs (inside a reader, or
       while one kept the grace period open) start over forever. And an
       ownerless slab with objects on its remote chain: stranded (below). */
    bool stranded = adoptable(sw, s, x) && GS_X_COUNT(x);
    if (!stranded && !has_done_chain(s))
        return;
    if (gsi_heap_owns(sw->h, x) || adoptable(sw, s, x)) {
        take_for_settle(sw, s, x);
        return;
    }
    if (sw->only_cls >= 0)
        return; /* its owner reclaims it on its own refills */
    sw->bytes += (size_t)reclaim_to_remote(s) * s->obj_size;
    /* Its owner may have given it up between our look and our push (it
       found nothing free and released it, or its thread exited): then the
       objects just pushed wait on the remote chain of a slab no list holds,
       and if none of its objects is still allocated no free will ever adopt
       it. Take it here (or in the next pass, as stranded). */
    x = atomic_load_explicit(&s->xstate, memory_order_relaxed);
    if (adoptable(sw, s, x) && GS_X_COUNT(x))
        take_for_settle(sw, s, x);
}

/* A slab owned by the sweeping heap: reclaim its done chains, then put it
   where it belongs (an adopted slab is on no list yet). */
static void settle(struct sweep *sw, struct gs_slab *s)
{
    bool adopted = s->where == GS_IN_NONE;
    if (adopted)
        gsi_slab_collect(s);
    gsi_heap_slab_unpark(s); /* its true count, before the reclaim lowers it */
    sw->bytes += (size_t)gsi_pending_reclaim_local(s) * s->obj_size;
    if (adopted)
        gsi_heap_settle_adopted(sw->h, s);
    else
        gsi_heap_slab_reclaimed(sw->h, s);
}

/* The sweep state of threads that could not map their own: one sweep at
   a time (taken inside the fork gate, so never held across a fork). */
static struct sweep emergency_sweep;
static pthread_mutex_t emergency_lock = PTHREAD_MUTEX_INITIALIZER;

void gsi_pending_sweeps_quiesce(void)
{
    /* seq_cst, with the increment and decrement in gsi_pending_sweep and
       reclaim_large: a sweep that took a chain (or the large stack) before
       the caller took the others is counted here, and its push (a release
       CAS on xstate) and its counts are visible to the caller after this
       sees it finished. */
    while (atomic_load(&sweeps_running))
        sched_yield();
}

static size_t run_sweep(size_t *still_pending, int only_cls)
{
    struct sweep *sw = gsi_sweep_buffer();
    size_t bytes = 0;
    gsi_heap_get(); /* before the gate: the gate flag lives in the heap */
    _Atomic int *gate = gate_enter();
    bool shared = sw == &emergency_sweep;
    if (shared)
        pthread_mutex_lock(&emergency_lock);
    atomic_fetch_add(&sweeps_running, 1);
    do {
        sw->h = gsi_heap_get();
        sw->only_cls = only_cls;
        sw->bytes = 0;
        sw->full = false;
        sw->nsettle = 0;
        gsi_segments_foreach(sweep_slab, sw);
        for (unsigned i = 0; i < sw->nsettle; i++)
            settle(sw, sw->settle[i]);
        bytes += sw->bytes;
    } while (sw->full);
    atomic_fetch_sub(&sweeps_running, 1);
    if (shared)
        pthread_mutex_unlock(&emergency_lock);
    if (only_cls < 0)
        bytes += reclaim_large();
    gate_leave(gate);
    if (still_pending) {
        struct gs_stats st;
        gsi_pending_stats_counts(&st);
        *still_pending = st.pending_objects;
    }
    return bytes;
}

size_t gsi_pending_sweep(size_t *still_pending)
{
    return run_sweep(still_pending, -1);
}

/* The engine's lazy thread calls this after a grace period, when the
   allocator asked (pending memory and perhaps no allocation traffic). */
static void pending_hook(void)
{
    size_t left = 0;
    gsi_pending_sweep(&left);
    if (left)
        gsi_rcu_request_reclaim();
}

void gsi_pending_kick(void)
{
    atomic_store_explicit(&gsi_pending_unarmed, false, memory_order_relaxed);
    if (!atomic_load_explicit(&hook_registered, memory_order_relaxed) &&
        !atomic_exchange_explicit(&hook_registered, true, memory_order_relaxed))
        gsi_rcu_set_reclaim_hook(pending_hook);
    gsi_rcu_request_reclaim();
}

GS_EXPORT size_t gs_reclaim(size_t bytes)
{
    (void)bytes; /* everything done is reclaimed: the count is exact either way */
    if (gsi_tls_mine != &gsi_empty_heap)
        gsi_remote_flush(gsi_tls_mine); /* this thread's remote frees reach their slabs */
    if (!gsi_rcu_in_reader())
        gsi_gp_wait(gsi_gp_cookie());
    else
        gsi_gp_advance();
    size_t made = gsi_pending_sweep(NULL);
    /* A sweep on another thread (the engine's lazy thread) may hold chains
       it took but has not relinked and counted yet: once this returns,
       the statistics count them reclaimed. */
    gsi_pending_sweeps_quiesce();
    return made;
}

bool gsi_oom_reclaim(void)
{
    size_t freed;
    if (gsi_tls_mine != &gsi_empty_heap) {
        gsi_remote_flush(gsi_tls_mine);
        /* The empty slabs this heap keeps for reuse: into their segments,
           decommitted by the purge below. (Other heaps' are theirs.) */
        freed = gsi_heap_trim(gsi_tls_mine);
    } else {
        freed = 0;
    }
    if (!gsi_rcu_in_reader())
        gsi_gp_wait(gsi_gp_cookie());
    freed += gsi_pending_sweep(NULL);
    freed += gsi_segments_purge(true);
    freed += gsi_large_trim(true);
    return freed > 0;
}

/* Per-thread sweep state: 8 KiB, too big for a small thread stack, and
   the sweep must not call malloc (it runs on allocation failure). */
static __thread struct sweep *sweep_buffer;

struct sweep *gsi_sweep_buffer(void)
{
    if (!sweep_buffer) {
        size_t bytes = (sizeof(struct sweep) + GS_PAGE - 1) & ~(size_t)(GS_PAGE - 1);
        sweep_buffer = gsi_os_map_aligned(bytes, GS_PAGE);
        if (!sweep_buffer)
            sweep_buffer = &emergency_sweep; /* last resort, shared (locked) */
    }
    return sweep_buffer;
}

void gsi_pending_stats_counts(struct gs_stats *st)
{
    memset(st, 0, sizeof *st);
    gsi_pending_stats(st);
}

void gsi_pending_stats(struct gs_stats *st)
{
    int64_t per_class[GS_NCLASSES] = {0};
    uint64_t reclaimed = atomic_load_explicit(&orphan_reclaimed, memory_order_relaxed);
    for (unsigned c = 0; c < GS_NCLASSES; c++)
        per_class[c] = atomic_load_explicit(&orphan_pending[c], memory_order_relaxed);
    gsi_heaps_pending(per_class, &reclaimed);
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        size_t n = per_class[c] > 0 ? (size_t)per_class[c] : 0;
        st->class_pending_objects[c] = n;
        st->class_pending_bytes[c] = n * gsi_classes[c].size;
        st->pending_objects += n;
        st->pending_bytes += n * gsi_classes[c].size;
    }
    st->pending_objects += (size_t)atomic_load_explicit(&large_pending_objects, memory_order_relaxed);
    st->pending_bytes += (size_t)atomic_load_explicit(&large_pending_bytes, memory_order_relaxed);
    st->reclaimed_objects = reclaimed;
    st->gp_started = gsi_gp_started();
    st->gp_completed = gsi_gp_completed();
}
