/*
 * The read side. gs_rcu_read_lock() publishes, in the thread's record, the
 * grace-period sequence it saw on entry; gs_rcu_read_unlock() clears it. A
 * grace period that starts at sequence `start` waits only for records whose
 * snapshot is non-zero and below `start` (see gp.c), so readers that enter
 * after a grace period started never hold it up.
 *
 * The snapshot doubles as the "inside" flag (it is never 0 inside), and
 * `nested` counts only the locks inside the outermost one, so the
 * outermost lock and unlock each write one word. Budget: the outermost
 * lock is a TLS load, three predictable branches (inside, registered,
 * mode), one load of the sequence (through the GOT: engine.h) and one
 * store; the outermost unlock one load of `nested` and of the snapshot,
 * one store, one load of gsi_gp_waiting and four branches (and one load
 * and branch for a wait owed to it, gp.c, made after the section ended:
 * only after an allocation inside it could not wait). In membarrier
 * mode neither issues a fence; in fence mode each issues one. Nested calls
 * only count. graceslab.h has the same steps inline
 * (GRACESLAB_RCU_INLINE), with the mode and the registration folded into
 * the call bit of `nested`: two loads and one branch decide the lock's
 * fast path, and the sequence is one load of the program's copy.
 *
 * Signal handlers may use the read side. On a registered thread, a handler
 * that interrupts lock or unlock at any instruction leaves the record as
 * it found it: it either sees the snapshot unset and publishes and clears
 * its own (the interrupted lock then stores a snapshot loaded no later
 * than the handler's, which only makes grace periods wait longer), or it
 * sees it set and counts in `nested`, which it restores. A lock on an
 * unregistered thread links the record only if the registry lock is free
 * (a try-lock: the code the handler interrupted may hold it, in a
 * grace-period scan, a fork or its own registration) and the thread is not
 * exiting; otherwise the section is anonymous: counted in
 * gsi_rcu_anon_readers, for which every grace period waits (engine.h).
 * So a handler never waits for a lock. A wait owed to the unlock is set
 * only in an outermost section and taken from the record before the
 * section ends: a handler's section, nested in the one it interrupts or
 * begun outside any, neither finds nor leaves one (its own outermost
 * section that allocates may owe and pay its own).
 */
#include "rcu/engine.h"
#include "rcu/internal.h"
#include "graceslab.h"

_Atomic unsigned long gsi_rcu_anon_readers;

/* Outermost lock of an anonymous section (the record is not linked).
   Runs with signals blocked: a handler that forks must not find the count
   and the mark disagreeing (the fork child rebuilds the count from the
   mark). Anonymous sections are rare, so the two system calls on each end
   do not matter. Count first, mark second, all the same. */
static GS_NOINLINE void anon_lock(struct gsi_rcu_reader *r)
{
    sigset_t saved;
    gsi_rcu_signals_block(&saved);
    /* seq_cst RMW, then a seq_cst fence before the critical section's
       loads: store-buffering against the driver, which starts the grace
       period (seq_cst store), issues its writer barrier and then loads the
       count (seq_cst, gp_readers_blocking_locked()). Either the driver sees
       this increment and waits for the decrement, or the increment and the
       fence come after its load in the total order, and the loads of the
       critical section see what the updater unlinked before the start. */
    atomic_fetch_add_explicit(&gsi_rcu_anon_readers, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    /* Relaxed: owner only (handlers run on this thread). */
    atomic_store_explicit(&r->snap, GSI_RCU_SNAP_ANON, memory_order_relaxed);
    /* A handler may have linked the record between the caller's test and
       the mark (no handler links it after: register_slow refuses inside a
       section). The inlined unlock must still call anon_unlock(). */
    gsi_rcu_reader_set_call(r, true);
    gsi_rcu_signals_restore(&saved);
}

/* Outermost unlock of an anonymous section; signals blocked, as in
   anon_lock(). */
static GS_NOINLINE void anon_unlock(struct gsi_rcu_reader *r)
{
    sigset_t saved;
    gsi_rcu_signals_block(&saved);
    atomic_store_explicit(&r->snap, 0, memory_order_relaxed);
    gsi_rcu_reader_set_call(r, !r->registered || gsi_rcu_fences);
    /* Release (in the seq_cst RMW): the critical section happens before
       the driver's load that sees the count drop; pairs with that load. */
    atomic_fetch_sub_explicit(&gsi_rcu_anon_readers, 1, memory_order_seq_cst);
    /* Decrement before the load of gsi_gp_waiting (store-buffering against
       the driver's store of it, writer barrier, rescan; as in
       gs_rcu_read_unlock()). */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&gsi_gp_waiting, memory_order_relaxed))
        gsi_rcu_wake_gp_slow();
    gsi_rcu_signals_restore(&saved);
}

GS_EXPORT void gs_rcu_read_lock(void)
{
    struct gsi_rcu_reader *r = &gsi_rcu_self;
    /* Relaxed: only this thread writes its snapshot. */
    if (atomic_load_explicit(&r->snap, memory_order_relaxed) != 0) {
        r->nested++; /* the count, below the call bit */
        return;
    }
    if (GS_UNLIKELY(!r->registered) && !gsi_rcu_register_slow(false)) {
        anon_lock(r);
        return;
    }
    /* Acquire: pairs with the seq_cst store that starts a grace period in
       gp_start_locked(); a reader that sees the new sequence (and so is not
       waited for) sees everything the updater did before the start. */
    uint64_t s = atomic_load_explicit(&gsi_gp_seq, memory_order_acquire);
    /* Release: pairs with the acquire load in gp_readers_blocking_locked();
       if the driver reads this snapshot, this thread's earlier critical
       sections happen before the end of the grace period. */
    atomic_store_explicit(&r->snap, s, memory_order_release);
    /* Orders the snapshot store before the critical section's loads.
       Fence mode: seq_cst fence, pairs with the seq_cst fence after the
       sequence store in gp_start_locked() (store-buffering: either the
       driver sees our snapshot or we see the updater's unlink). Membarrier
       mode: a compiler barrier that the driver's membarrier(2) promotes to
       a full barrier (same pairing). */
    if (gsi_rcu_fences)
        atomic_thread_fence(memory_order_seq_cst);
    else
        atomic_signal_fence(memory_order_seq_cst);
}

/* Ends the outermost section of a linked record that entered at `snap`. */
static inline void end_section(struct gsi_rcu_reader *r, uint64_t snap)
{
    /* Release: the critical section's accesses happen before any driver
       load (acquire, gp_readers_blocking_locked()) that sees the record
       quiescent; pairs with that acquire. */
    atomic_store_explicit(&r->snap, 0, memory_order_release);
    /* Orders the store above before the load of gsi_gp_waiting below
       (store-buffering against the driver, which stores its mark in
       gsi_gp_waiting and then issues its writer barrier before
       rescanning): either the driver's rescan sees us quiescent or we see
       it waiting and wake it. Fence mode: pairs with the seq_cst fence of
       gsi_gp_writer_barrier(); membarrier mode: compiler barrier promoted
       by its membarrier(2). */
    if (gsi_rcu_fences)
        atomic_thread_fence(memory_order_seq_cst);
    else
        atomic_signal_fence(memory_order_seq_cst);
    /* Relaxed: only decides whether to wake; the fence above orders it.
       Either this load sees the driver's mark, or the driver's rescan
       (after its store of the mark and its barrier) sees the snapshot
       cleared; a section that began after the grace period started is not
       waited for, so its unlock need not wake. */
    uint32_t waiting = atomic_load_explicit(&gsi_gp_waiting, memory_order_relaxed);
    if (GS_UNLIKELY(gsi_rcu_unlock_wakes(snap, waiting)))
        gsi_rcu_wake_gp_slow();
}

/* The outermost unlock of a section that owes a wait (gp.c): taken while
   the section is open, made once it has ended. Out of line, so that the
   unlock's fast path pays one load and branch for it. */
static GS_NOINLINE void unlock_owing(struct gsi_rcu_reader *r, uint64_t snap)
{
    struct gsi_rcu_owed_wait owed;
    gsi_rcu_take_owed_wait(r, &owed);
    end_section(r, snap);
    gsi_rcu_pay_owed_wait(&owed);
}

GS_EXPORT void gs_rcu_read_unlock(void)
{
    struct gsi_rcu_reader *r = &gsi_rcu_self;
    if (GS_UNLIKELY(gsi_rcu_depth_inner(r) != 0)) {
        r->nested--; /* the count, below the call bit */
        return;
    }
    /* Relaxed: only this thread writes its snapshot. */
    uint64_t snap = atomic_load_explicit(&r->snap, memory_order_relaxed);
    if (GS_UNLIKELY(snap == GSI_RCU_SNAP_ANON)) {
        anon_unlock(r);
        return;
    }
    if (GS_LIKELY(snap != 0)) {
        if (GS_UNLIKELY(r->owed.cookie != 0))
            unlock_owing(r, snap);
        else
            end_section(r, snap);
        return;
    }
    gsi_fatal_msg("gs_rcu_read_unlock",
                  "unbalanced unlock: not inside a read-side critical section");
}

/* Exported: the inlined read side (graceslab.h) calls it too. */
GS_INLINE_ABI GS_NOINLINE void gsi_rcu_wake_gp_slow(void)
{
    /* Relaxed exchange: the futex wake is what matters; whoever clears the
       mark issues it. The driver rescans after every wakeup, and sets the
       mark again if a reader still holds the grace period. (Code inlined
       from an older graceslab.h calls this on any mark: a spurious wake.) */
    if (atomic_exchange_explicit(&gsi_gp_waiting, 0, memory_order_relaxed))
        gsi_futex_wake(&gsi_gp_waiting, 1);
}

bool gsi_rcu_in_reader(void)
{
    return atomic_load_explicit(&gsi_rcu_self.snap, memory_order_relaxed) != 0;
}
