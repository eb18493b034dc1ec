/*
 * graceslab — a slab allocator with RCU-deferred free built into the slab.
 *
 * This is the only public header. It is usable from C (C11) and C++.
 *
 * Three families of calls:
 *   1. General allocation (gs_malloc ...). libgraceslab also exports these
 *      as malloc/free/calloc/realloc/... so that LD_PRELOAD or static
 *      linking makes graceslab the process allocator.
 *   2. Deferred free (gs_free_rcu, caches): an object freed with
 *      gs_free_rcu() goes back to its slab only after a full grace period.
 *      The *object* waits, not the caller: the call never blocks, never
 *      allocates and makes no system call.
 *   3. The grace-period engine (gs_rcu_*): read-side critical sections,
 *      synchronous and polled grace periods, and intrusive callbacks.
 *
 * Bad input (double free, foreign or interior pointer, misuse of the
 * read side) aborts the process with one line on stderr naming the call
 * and the pointer. Allocation failure returns NULL with errno = ENOMEM.
 */
#ifndef GRACESLAB_H
#define GRACESLAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * General allocation. glibc semantics; every pointer is 16-byte aligned.
 * Inside a read-side critical section none of these waits for a grace
 * period that waits for the section, so all may be called there; past the
 * bound below they may wait, at most 20 ms, for one in progress that does
 * not, and leave a wait for one that does to the section's unlock (at most
 * 20 ms after the section ends; docs/rcu.md). Outside one, an
 * allocation may wait for a grace period, so that deferred memory cannot
 * pile up: before it maps new memory for a size class of which more than
 * GRACESLAB_PENDING_EXPEDITE_KB (256 KiB) is deferred (by this thread or
 * any other; blocks above 256 KiB count together); and when the OS refused
 * memory (pending memory is then reclaimed and the allocation retried
 * once). So, as around gs_synchronize_rcu(), do not allocate, nor end a
 * section that allocated, while holding a lock that a reader may wait for
 * inside its critical section, in a program that defers frees (inside a
 * section such waits are bounded: they cost time, not progress).
 * ------------------------------------------------------------------------ */

/* size bytes, uninitialised. gs_malloc(0) returns a unique pointer.
   NULL + ENOMEM on failure (also for size > PTRDIFF_MAX). */
void *gs_malloc(size_t size);

/* n * size zeroed bytes; NULL + ENOMEM on overflow or failure. */
void *gs_calloc(size_t n, size_t size);

/* glibc realloc: p == NULL is gs_malloc(size); size == 0 frees p and returns
   NULL; on failure returns NULL with ENOMEM and p stays valid. Growing
   within gs_usable_size(p) returns p itself. A block that grows by less
   than a quarter and must move gets room for a quarter more than it had
   (its next small growth stays in place), as tcmalloc does. */
void *gs_realloc(void *p, size_t size);

/* alignment must be a power of two (any, up to at least 64 MiB);
   otherwise NULL + EINVAL. size need not be a multiple of alignment. */
void *gs_aligned_alloc(size_t alignment, size_t size);

/* Returns p to the allocator at once. NULL is ignored; errno is preserved.
   Aborts on a pointer graceslab did not hand out, on a double free and on
   an object already handed to gs_free_rcu(). */
void gs_free(void *p);

/* Bytes usable at p (>= the size asked for); 0 for NULL. */
size_t gs_usable_size(const void *p);

/* ------------------------------------------------------------------------
 * Deferred free.
 * ------------------------------------------------------------------------ */

/* Marks p pending: it returns to its slab only after a full grace period
   has elapsed, i.e. after every read-side critical section that was running
   when gs_free_rcu() was called has ended. graceslab does not write p's
   bytes before then, so concurrent readers see the object intact.
   Works on any graceslab pointer (small or large), from any thread.
   Never allocates, never blocks, makes no system call, O(1); may be called
   inside a read-side critical section. NULL is ignored. Aborts on a foreign
   pointer and on a second gs_free_rcu() or gs_free() of the same object. */
void gs_free_rcu(void *p);

/* Dedicated caches (kmem_cache-like): objects of one size and alignment. */
struct gs_cache;

/* GS_CACHE_TYPESAFE_BY_RCU: the *slab* memory, not the object, waits for a
 * grace period. An object freed with gs_cache_free() may be handed out again
 * at once, to another caller, as an object of the same cache; but its memory
 * does not stop being an object of this cache (is not returned to the OS or
 * to another size) until a grace period has passed. A reader under
 * gs_rcu_read_lock() may therefore keep dereferencing a pointer it found,
 * and will always see an object of this type — but possibly a *different*
 * object than the one it looked up. WARNING: as with the kernel's
 * SLAB_TYPESAFE_BY_RCU, this does not delay the reuse of the object; readers
 * must re-validate identity (a key or generation field, or a lock inside
 * the object) after acquiring it. Use gs_cache_free_rcu() when the object
 * itself must outlive readers. */
#define GS_CACHE_TYPESAFE_BY_RCU 0x1u

/* Creates a cache of objects of size bytes (1 to 32768) aligned to align
   (0 means 16; a power of two up to 32768). name is copied (up to 31 bytes) for stats
   and messages. Returns NULL + EINVAL on bad arguments, NULL + ENOMEM on
   failure. */
struct gs_cache *gs_cache_create(const char *name, size_t size, size_t align, unsigned flags);
void *gs_cache_alloc(struct gs_cache *c);         /* NULL + ENOMEM on failure */
void  gs_cache_free(struct gs_cache *c, void *p); /* aborts if p is not c's */
void  gs_cache_free_rcu(struct gs_cache *c, void *p); /* as gs_free_rcu() */
/* Waits for the cache's pending objects (a grace period), then frees it.
   Aborts if the cache still has live objects. Must not be called inside a
   read-side critical section. */
void  gs_cache_destroy(struct gs_cache *c);

/* ------------------------------------------------------------------------
 * Grace-period engine.
 * Threads register automatically on first use and unregister at exit.
 * ------------------------------------------------------------------------ */

/* Read-side critical section. Nestable; never blocks, never waits for a
   lock, also in a signal handler at any point of the thread it interrupts.
   No system call once the thread is registered (its first lock registers
   it; while that cannot be done at once, sections are counted globally,
   with a few system calls each; docs/rcu.md). One exception: when an
   allocation inside an outermost section, past graceslab's bound on
   memory pending grace periods, could not wait there for the grace period
   it needed (that one waits for the section), the section's unlock makes
   that wait after leaving it, for at most 20 ms (docs/rcu.md, "Waits owed
   to the unlock"). */
void gs_rcu_read_lock(void);
/* Aborts on an unlock without a matching lock. */
void gs_rcu_read_unlock(void);

/* Pointer publication. gs_rcu_dereference(p) loads p with consume
   (implemented as acquire) ordering; gs_rcu_assign_pointer(p, v) stores v
   into p with release ordering, so a reader that sees v sees the object v
   points to fully initialised. p must be an lvalue of pointer type. */
#define gs_rcu_dereference(p) __atomic_load_n(&(p), __ATOMIC_ACQUIRE)
#define gs_rcu_assign_pointer(p, v) __atomic_store_n(&(p), (v), __ATOMIC_RELEASE)

/* Waits for a full grace period. Blocks. Aborts if called inside a
   read-side critical section (it would wait for the caller). */
void gs_synchronize_rcu(void);

/* Polled grace periods: a cookie now, and whether a full grace period has
   elapsed since. gs_rcu_poll_state() never blocks and may be called
   anywhere; gs_rcu_get_state() never blocks and may start a grace period. */
unsigned long gs_rcu_get_state(void);
bool gs_rcu_poll_state(unsigned long cookie);

/* Intrusive callback: embed in the object; call_rcu never allocates. */
struct gs_rcu_head {
    struct gs_rcu_head *next;
    void (*func)(struct gs_rcu_head *head);
    unsigned long cookie;
};

/* Invokes fn(h) from the engine's background thread after a full grace
   period. Lazy: batches until the lazy timeout (GRACESLAB_RCU_LAZY_MS,
   default 1000) or a batch bound. Never allocates, never blocks (but for
   the first deferral in the process, which creates the engine's thread:
   this call, gs_free_rcu or the allocator); may be called inside a
   read-side critical section. If that thread cannot be created, the call
   aborts with one line on stderr, as its callback could never run. */
void gs_call_rcu(struct gs_rcu_head *h, void (*fn)(struct gs_rcu_head *));
/* As gs_call_rcu(), but the grace period starts at once (no lazy wait). */
void gs_call_rcu_hurry(struct gs_rcu_head *h, void (*fn)(struct gs_rcu_head *));
/* Waits until every callback queued before the call has been invoked.
   Blocks; aborts inside a read-side critical section. */
void gs_rcu_barrier(void);

/* Optional: explicit registration (automatic otherwise). Unregistering or
   exiting inside a read-side critical section aborts. Both wait for the
   registry lock: not for signal handlers. */
void gs_rcu_register_thread(void);
void gs_rcu_unregister_thread(void);

/* ------------------------------------------------------------------------
 * Memory pressure and accounting.
 * ------------------------------------------------------------------------ */

/* Expedites a grace period (unless called inside a read-side critical
   section, where it only polls) and makes pending objects reusable until at
   least `bytes` are reclaimed or nothing is left. Returns the exact number
   of bytes this call made reusable: a sweep running meanwhile on another
   thread (another gs_reclaim, the engine's background thread) may make some
   reusable itself, and they count there, not here. gs_stats_get() counts
   both: once this returns, no such sweep holds objects it has not counted
   (threads still allocating or deferring change the figures as they go).
   Blocks (outside read-side sections). */
size_t gs_reclaim(size_t bytes);

#define GS_STATS_CLASSES 96

struct gs_stats {
    size_t mapped_bytes;      /* address space taken from the OS, in use */
    size_t committed_bytes;   /* of which not given back with madvise
                                 (free 33..256 KiB blocks whose pages decay
                                 or malloc_trim gave back do not count; an
                                 empty slab counts whole until purged) */
    size_t allocated_bytes;   /* bytes in live blocks (usable sizes) */
    size_t large_bytes;       /* of which in large (mmap'd) blocks */
    size_t segments;          /* small-object segments mapped */
    size_t slabs;             /* slabs in use */
    size_t heaps;             /* thread heaps, live or abandoned */
    size_t pending_objects;   /* freed with gs_free_rcu, grace period not yet reclaimed */
    size_t pending_bytes;     /* their total usable size */
    size_t reclaimed_objects; /* pending objects made reusable, ever */
    unsigned long gp_started;   /* grace periods started, ever */
    unsigned long gp_completed; /* grace periods completed, ever */
    unsigned nclasses;        /* entries used in the arrays below */
    size_t class_size[GS_STATS_CLASSES];          /* object size of class i */
    size_t class_allocated[GS_STATS_CLASSES];     /* live objects of class i */
    size_t class_pending_objects[GS_STATS_CLASSES];
    size_t class_pending_bytes[GS_STATS_CLASSES];
};

/* Fills *out. Figures are a consistent-enough snapshot: counters of other
   threads are read without stopping them. Never allocates. */
void gs_stats_get(struct gs_stats *out);

/* ------------------------------------------------------------------------
 * Inlined read side (opt-in). Define GRACESLAB_RCU_INLINE before including
 * this header and gs_rcu_read_lock()/gs_rcu_read_unlock() expand inline,
 * as liburcu's _LGPL_SOURCE does for its read side: same contract, no call
 * (see docs/rcu.md for the figures). Two conditions: the program runs with
 * the libgraceslab of the same version as this header (the inline code
 * reads the library's per-thread record, whose layout is below), and
 * libgraceslab is loaded at start-up (linked, or LD_PRELOAD), not with
 * dlopen(): the record is in initial-exec TLS. The record's and the
 * grace-period state's symbols carry their version (_v3): a library whose
 * layout differs, or whose fields mean something else, does not export
 * them, so the program fails to load instead of reading the wrong fields.
 * Needs C99 or later, or C++ (inline functions).
 *
 * The names below (gsi_*) are graceslab's internals, public only for the
 * inline code; do not use them directly.
 * ------------------------------------------------------------------------ */

/* The part of the calling thread's reader record (rcu/engine.h) the read
   side uses; the library checks that the layouts agree. */
struct gsi_rcu_reader_view {
    uint64_t snap;               /* 0 outside; inside, the sequence seen on
                                    entry (never 0) */
    unsigned long nested;        /* locks inside the outermost one, plus
                                    GSI_RCU_NESTED_CALL when the outermost
                                    lock and unlock must call the library,
                                    or the unlock must (a wait owed) */
};
/* The top bit of `nested`: the thread is not registered, or the read side
   needs fences, or the section is an anonymous one (rcu/reader.c), or it
   owes its unlock a wait (rcu/gp.c). Locks never nest 2^63 deep, so the
   count below it never reaches it. */
#define GSI_RCU_NESTED_CALL (~0UL ^ (~0UL >> 1))
/* The grace-period state the read side reads: the library's own (it reads
   it through its GOT, so that an executable's copy relocation of it is the
   one copy everybody uses). */
struct gsi_rcu_gp_view {
    uint64_t seq;                /* the grace-period sequence */
    uint32_t waiting;            /* 0, or the driver waits for the readers
                                    that entered before this sequence value
                                    (low half) to leave */
};
extern struct gsi_rcu_gp_view gsi_rcu_gp_v3;
/* Wakes the grace-period driver that waits for readers (rcu/reader.c). */
void gsi_rcu_wake_gp_slow(void);
/* The calling thread's record (the library's own, under this type). The
   suffix is the version: bump it, with gsi_rcu_gp_v3's, with any change to
   either view's layout or to what a field means (v2: gp_waiting held a
   sequence mark, was 0/1; v3: the grace-period state is read directly, and
   `nested` carries the call bit, was a separate `fast` flag). */
extern __thread struct gsi_rcu_reader_view gsi_rcu_self_view_v3
    __attribute__((tls_model("initial-exec")));

#ifdef GRACESLAB_RCU_INLINE
/* The steps, orders and pairings of gs_rcu_read_lock()/unlock() in
   rcu/reader.c, for the membarrier mode only: the first lock of an
   unregistered thread, the fence mode, an anonymous section and a bad
   unlock call the library (the out-of-line functions, declared above this
   point, so these calls are not the macros below). */
static inline void gsi_rcu_read_lock_inline(void)
{
    struct gsi_rcu_reader_view *r = &gsi_rcu_self_view_v3;
    /* Relaxed: only this thread writes its record. Inside a section
       (snap != 0) this lock only counts; outside, `nested` is 0 or the
       call bit. */
    uint64_t snap = __atomic_load_n(&r->snap, __ATOMIC_RELAXED);
    unsigned long nested = r->nested;
    if (__builtin_expect((snap | nested) != 0, 0)) {
        if (snap != 0)
            r->nested = nested + 1;
        else
            gs_rcu_read_lock(); /* registers, or fence mode */
        return;
    }
    /* Acquire: pairs with the store that starts a grace period. */
    uint64_t seq = __atomic_load_n(&gsi_rcu_gp_v3.seq, __ATOMIC_ACQUIRE);
    /* Release: pairs with the driver's acquire load of the snapshot. */
    __atomic_store_n(&r->snap, seq, __ATOMIC_RELEASE);
    /* Snapshot store before the critical section's loads: a compiler
       barrier that the driver's membarrier(2) promotes to a full one. */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

static inline void gsi_rcu_read_unlock_inline(void)
{
    struct gsi_rcu_reader_view *r = &gsi_rcu_self_view_v3;
    unsigned long nested = r->nested;
    if (__builtin_expect(nested != 0, 0)) {
        if (nested != GSI_RCU_NESTED_CALL)
            r->nested = nested - 1; /* inner unlock (either mode) */
        else
            gs_rcu_read_unlock(); /* fence mode, an anonymous section, or a wait owed */
        return;
    }
    uint64_t snap = __atomic_load_n(&r->snap, __ATOMIC_RELAXED);
    if (__builtin_expect(snap == 0, 0)) {
        gs_rcu_read_unlock(); /* aborts: no lock to undo */
        return;
    }
    /* Release: the critical section happens before a driver load that
       sees the record quiescent. */
    __atomic_store_n(&r->snap, 0, __ATOMIC_RELEASE);
    /* The store above before the load of `waiting` below
       (store-buffering against the driver; membarrier mode, as above). */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    /* The driver sleeps on the low half of the sequence value that started
       its grace period: wake it only if this section began before that. */
    uint32_t waiting = __atomic_load_n(&gsi_rcu_gp_v3.waiting, __ATOMIC_RELAXED);
    if (__builtin_expect(waiting != 0 && (int32_t)((uint32_t)snap - waiting) < 0, 0))
        gsi_rcu_wake_gp_slow();
}

#define gs_rcu_read_lock gsi_rcu_read_lock_inline
#define gs_rcu_read_unlock gsi_rcu_read_unlock_inline
#endif /* GRACESLAB_RCU_INLINE */

#ifdef __cplusplus
}
#endif

#endif /* GRACESLAB_H */
