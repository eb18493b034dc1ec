/*
 * Private to rcu/: the state the engine's files share. The allocator never
 * includes this; it uses rcu/internal.h.
 *
 *   thread.c    per-thread reader records, the registry, init, fork, exit
 *   reader.c    gs_rcu_read_lock/unlock (the read side)
 *   gp.c        the grace-period sequence and the machinery that drives it
 *   callback.c  gs_call_rcu, the lazy thread, gs_rcu_barrier, reclaim hook
 *
 * See gp.c for the lock order and the ordering argument, docs/rcu.md for
 * the prose version.
 */
#ifndef GS_RCU_ENGINE_H
#define GS_RCU_ENGINE_H

#include "alloc/common.h"
#include "rcu/internal.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* A wait owed to the outermost unlock (gp.c, "Waits owed to the unlock"):
   for the grace period named by cookie (0: none), at most max_ns, even
   within a back-off if past_cap. */
struct gsi_rcu_owed_wait {
    uint64_t cookie, max_ns;
    bool past_cap;
};

/* One per thread, in initial-exec TLS (so the record of a live thread never
 * moves and taking its address never calls the dynamic loader). Linked into
 * the registry on first use; unlinked when the thread exits or unregisters,
 * always before its memory goes away. */
struct gsi_rcu_reader {
    /* 0 outside a read-side critical section; inside, the value of
       gsi_gp_seq the outermost gs_rcu_read_lock() loaded (never 0: the
       sequence starts at GSI_GP_SEQ_BASE), so it is also the thread's
       "inside" flag. Written by the owner only; read by the grace-period
       driver under the registry lock. */
    _Atomic uint64_t snap;
    /* Locks nested inside the outermost one (0 when not nested): depth is
       (nested & ~GSI_RCU_NESTED_CALL) + 1 while snap != 0. Only the
       outermost lock and unlock then write snap, one store each. The top
       bit, GSI_RCU_NESTED_CALL (graceslab.h), is set unless the thread is
       registered in membarrier mode outside an anonymous section: then the
       inlined read side (graceslab.h, GRACESLAB_RCU_INLINE) calls the
       library for the outermost lock and unlock; one word serves both
       tests. The bit changes when the record is linked or unlinked, around
       an anonymous section and in a fork child (gsi_rcu_reader_set_call).
       Owner only (and the fork child / exit destructor, which run on the
       owner thread). It is also set inside a section for the outermost
       unlock to pay a wait the section owes (owed, below). The
       fields up to here are laid out as struct
       gsi_rcu_reader_view (graceslab.h; checked in thread.c). */
    unsigned long nested;
    /* Linked into the registry? Owner writes it with the registry lock
       held; the owner reads it without. */
    bool registered;
    /* The thread is exiting: its RCU exit destructor (which unlinks the
       record) or the allocator's has run. It must not link the record
       again: glibc runs at most four rounds of key destructors, so one
       linked in the last would outlive the thread's TLS. Its later
       read-side sections are anonymous (below). Owner only. */
    bool exited;
    /* The wait the thread's outermost unlock owes (owed.cookie 0: none).
       Set inside a registered section, not nested, by an allocation that
       could not wait there, together with the call bit, so that an
       inlined unlock calls the library. Owner only (a signal handler's
       section is nested in the one it interrupts, or ends before the
       interrupted code goes on: it sets none, or pays its own). */
    struct gsi_rcu_owed_wait owed;
    /* Registry links; registry lock. */
    struct gsi_rcu_reader *next, *prev;
};

extern __thread struct gsi_rcu_reader gsi_rcu_self;

/* The outermost unlock takes the wait its section owes from the record
   (clearing it, and restoring the call bit) while the section is still
   open, so that a signal handler's section that begins once it has ended
   finds nothing to pay; and makes it after the section ended (gp.c). */
void gsi_rcu_take_owed_wait(struct gsi_rcu_reader *r, struct gsi_rcu_owed_wait *w);
void gsi_rcu_pay_owed_wait(const struct gsi_rcu_owed_wait *w);

/* Locks nested inside the outermost one, without the call bit. */
static inline unsigned long gsi_rcu_depth_inner(const struct gsi_rcu_reader *r)
{
    return r->nested & ~GSI_RCU_NESTED_CALL;
}

/* Sets or clears the call bit of r (owner thread), keeping the count. */
static inline void gsi_rcu_reader_set_call(struct gsi_rcu_reader *r, bool call)
{
    r->nested = gsi_rcu_depth_inner(r) | (call ? GSI_RCU_NESTED_CALL : 0);
}

/* Anonymous read-side sections: when the thread cannot link its record
 * without waiting (the registry lock is held, perhaps by the very code a
 * signal handler interrupted: a grace-period scan, a fork, the thread's
 * own registration) or must not (it is exiting), its outermost lock counts
 * itself in gsi_rcu_anon_readers instead and sets snap to this marker;
 * every grace period waits for the count to be 0. The marker is never below
 * a grace period's start, so a scan would never wait on it; and an
 * unregistered record is not scanned anyway. */
#define GSI_RCU_SNAP_ANON UINT64_MAX
extern _Atomic unsigned long gsi_rcu_anon_readers;

/* Read-side mode, chosen once by gsi_rcu_init() before any thread is
   registered (pthread_once orders it before every read side that can run):
   true = seq_cst fences on the read side; false = compiler barriers only,
   the writer issues membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED). */
extern bool gsi_rcu_fences;

/* The grace-period sequence: (seq - GSI_GP_SEQ_BASE) / 2 grace periods have
   completed; the low bit says one is in progress. Starts at a non-zero even
   value so that a reader's snapshot is never 0. Written by the driver under
   the GP mutex; read anywhere.
   gsi_gp_waiting: non-zero while the grace-period driver sleeps on this
   futex word waiting for readers: the low half of the sequence value that
   started the grace period (odd). The outermost unlock of a reader that
   entered before it (gsi_rcu_unlock_wakes) wakes the driver.
   Both live in the exported gsi_rcu_gp_v3 (defined in gp.c), which the
   inlined read side reads directly. A program that reads it gets a copy
   relocation (its own copy, which the dynamic linker fills from ours), so
   the library must reach it through its GOT as well, never directly: an
   extern declaration of a default-visibility object does that (gcc and
   clang, with -fno-semantic-interposition too). The names below are that
   object's fields as atomics (same size and alignment as the plain view's;
   gsi_gp_seq is in rcu/internal.h, which the allocator reads too). */
#define GSI_GP_SEQ_BASE 4u
#define gsi_gp_waiting (*(_Atomic uint32_t *)&gsi_rcu_gp_v3.waiting)

/* Must the outermost unlock of a section that entered at sequence `snap`
   wake the driver, which stored `waiting` (0: nobody sleeps)? Only if the
   section began before the grace period the driver sleeps on: a later one
   does not hold it up. The halves compare modulo 2^32: a section that is
   inside keeps the sequence within a few values of its snapshot (every
   grace period that starts after it waits for it). graceslab.h's inline
   unlock makes the same test. */
static inline bool gsi_rcu_unlock_wakes(uint64_t snap, uint32_t waiting)
{
    return waiting != 0 && (int32_t)((uint32_t)snap - waiting) < 0;
}

/* Blocks every signal on the calling thread, saving the old mask, and
   restores it: around the few steps a signal handler that enters a
   read-side section must not interrupt (thread.c, reader.c). */
static inline void gsi_rcu_signals_block(sigset_t *saved)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, saved);
}

static inline void gsi_rcu_signals_restore(const sigset_t *saved)
{
    pthread_sigmask(SIG_SETMASK, saved, NULL);
}

/* thread.c */
void gsi_rcu_init(void);               /* idempotent, pthread_once */
/* Links gsi_rcu_self, waiting for the registry lock if `wait`; false if
   it did not (lock busy, or the thread exiting). */
bool gsi_rcu_register_slow(bool wait);
void gsi_rcu_registry_lock(void);
void gsi_rcu_registry_unlock(void);
/* First record of the registry (registry lock held). */
struct gsi_rcu_reader *gsi_rcu_registry_first_locked(void);

/* reader.c */
void gsi_rcu_wake_gp_slow(void);

/* gp.c: called by the fork child handler. */
void gsi_gp_atfork_child(void);
/* gsi_gp_wait() for the lazy thread, which no caller waits on: sleeps
   at once instead of spinning first. */
void gsi_gp_wait_background(uint64_t cookie);
/* The writer-side full barrier: membarrier(2) or a seq_cst fence. */
void gsi_gp_writer_barrier(void);
/* Aborts with "graceslab: <call>(): called inside a read-side critical
   section" if the calling thread is inside one. */
void gsi_gp_check_not_reader(const char *call);

/* callback.c: called by the fork child handler; and the wakeup counter the
   tests read (lazy thread returns from a sleep). */
void gsi_rcu_cb_atfork_prepare(void);
void gsi_rcu_cb_atfork_parent(void);
void gsi_rcu_cb_atfork_child(void);
uint64_t gsi_rcu_lazy_wakeups(void);
bool gsi_rcu_lazy_thread_exists(void);
/* Callbacks queued and not yet invoked (tests). */
uint64_t gsi_rcu_callbacks_outstanding(void);

/* Futex helpers (private futexes: the words are process-local). */
/* Returns false when it did not sleep at all (the word no longer held
   val: EAGAIN). Sets errno. */
static inline bool gsi_futex_wait(_Atomic uint32_t *word, uint32_t val,
                                  const struct timespec *rel)
{
    long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, val, rel, NULL, 0);
    return r == 0 || errno != EAGAIN;
}

static inline void gsi_futex_wake(_Atomic uint32_t *word, int n)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void gsi_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

static inline uint64_t gsi_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif /* GS_RCU_ENGINE_H */
