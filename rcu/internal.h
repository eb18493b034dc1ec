/*
 * The narrow interface between the allocator (alloc/) and the grace-period
 * engine (rcu/). The allocator calls these from its slow paths only.
 *
 * Cookies: a cookie names "a full grace period from the moment the cookie
 * was taken". gsi_gp_done(cookie) turns true once such a grace period has
 * completed and stays true. Cookies are values of the 64-bit grace-period
 * sequence, which never wraps; cookies taken later are never smaller.
 */
#ifndef GS_RCU_INTERNAL_H
#define GS_RCU_INTERNAL_H

#include "graceslab.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Cookie for a grace period that starts after this call. Never blocks, no
   system call, no allocation: one load of the sequence (a seq_cst fence
   orders the caller's earlier stores, e.g. an unlink, before it). */
uint64_t gsi_gp_cookie(void);
/* The sequence itself (rcu/engine.h), for callers that keep cookies
   truncated and rebuild them near it (alloc/pending.c). A field of the
   exported gsi_rcu_gp_v3 (graceslab.h), as an atomic: engine.h says why. */
#define gsi_gp_seq (*(_Atomic uint64_t *)&gsi_rcu_gp_v3.seq)

/* Has the grace period named by cookie completed? One acquire load. */
bool gsi_gp_done(uint64_t cookie);

/* Non-blocking progress: starts a grace period if none is running and one
   is needed, and completes the running one if every reader it waits for
   has left. Never waits; may issue membarrier(2). Safe inside a read-side
   critical section (the caller's own reader simply keeps the grace period
   open). */
void gsi_gp_advance(void);

/* Blocks until gsi_gp_done(cookie), expediting. Aborts with a clear line if
   the caller is inside a read-side critical section. */
void gsi_gp_wait(uint64_t cookie);

/* Is the calling thread inside a read-side critical section? */
bool gsi_rcu_in_reader(void);

/* The allocator's pending-memory hook. After gsi_rcu_request_reclaim(), the
   engine's lazy thread (started on demand, outside any allocator lock) makes
   sure a grace period completes within the lazy timeout and then calls the
   registered hook, once, from its own thread. With no request outstanding,
   the lazy thread sleeps without timeout: zero wakeups when idle.
   gsi_rcu_request_reclaim() may create the thread or wake it (system calls):
   the allocator calls it from slow paths, never from gs_free_rcu(). */
void gsi_rcu_set_reclaim_hook(void (*hook)(void));
void gsi_rcu_request_reclaim(void);

/* For an allocator past its pending bound inside a read-side critical
   section, which can neither wait for a grace period nor reuse memory
   before one: the lazy thread drives grace periods back to back (blocking
   waits, outside any reader) for the next 100 ms, and each call renews
   that. Grace periods then keep pace with the callers' deferrals. Left to
   the callers' one-scan nudges (gsi_gp_advance, which a reader preempted
   inside its section fails), they came as rarely as refills, which grew
   rarer as pending memory grew: pending memory grew without bound. Only
   grace periods: no hook call. Lock-free; may create or wake the thread. */
void gsi_rcu_expedite(void);

/* What an allocator past a pending bound does: waits for the grace period
   named by cookie (true), or inside a read-side critical section, where
   that wait would wait for the caller itself, calls gsi_rcu_expedite()
   instead (false: nothing completed yet). */
bool gsi_gp_wait_or_expedite(uint64_t cookie);

/* Inside a read-side critical section: waits, at most max_ns, for the
   grace period named by cookie, but only if the grace period in progress
   completes it and does not wait for the caller (it started before the
   caller's outermost gs_rcu_read_lock()). True if the cookie is done.
   Bounded, because the caller's section may hold a lock that a reader
   this grace period waits for wants; and after a time-out the thread does
   not wait for the same grace period again, nor at all for 100 ms, unless
   past_cap (the caller holds so much memory for grace periods that it
   must wait whatever it costs). Drives the grace period itself between
   1 ms sleeps. When the grace period it needs waits for the caller, the
   caller's outermost unlock will wait for it instead (bounded the same
   way; an outermost registered section only), and it yields the CPU once
   (sched_yield), so that a reader preempted inside its section can leave.
   Outside a section it returns gsi_gp_done(cookie) without waiting. Keeps
   errno. */
bool gsi_gp_wait_in_reader(uint64_t cookie, uint64_t max_ns, bool past_cap);

/* The allocator's exit destructor calls this on the exiting thread: from
   then on the thread never links its reader record (its read-side sections
   are anonymous; rcu/thread.c), which covers a thread whose first section
   is in a late round of key destructors, after which glibc may not run the
   RCU exit destructor again. A TLS store. */
void gsi_rcu_thread_exiting(void);

/* Counters for gs_stats_get(). */
uint64_t gsi_gp_started(void);
uint64_t gsi_gp_completed(void);

/* The engine's fork handlers, run inside the allocator's, which registers
   the two sets as one (alloc/heap.c: the order matters). */
void gsi_rcu_atfork_prepare(void);
void gsi_rcu_atfork_parent(void);
void gsi_rcu_atfork_child(void);
/* The child's part when the parent had one thread and the handlers took no
   lock (alloc/heap.c, fork_prepare): only what belongs to the new process
   (the membarrier registration), nothing the interrupted code may be
   changing. */
void gsi_rcu_atfork_child_alone(void);
/* The allocator's one-time init (alloc/heap.c), which registers those
   handlers: the engine's own init calls it. */
void gsi_heap_init_once(void);

#endif /* GS_RCU_INTERNAL_H */
