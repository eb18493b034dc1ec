/*
 * Grace periods: the 64-bit sequence, the driver that starts and ends
 * grace periods, and the cookie/done/advance/wait interface.
 *
 * Sequence (like the kernel's rcu_seq): gsi_gp_seq starts at
 * GSI_GP_SEQ_BASE (even). Starting a grace period sets it odd (s -> s+1),
 * ending it sets it even again (s+1 -> s+2). It never wraps (2^63 grace
 * periods). A cookie is (seq + 3) & ~1: the end value of the first grace
 * period that starts after the cookie was taken; done(c) is seq >= c.
 *
 * Which readers a grace period waits for: one that started at `start`
 * (odd) waits for every record whose snapshot is non-zero and < start,
 * i.e. that entered its critical section having seen the sequence before
 * the start. Readers that saw `start` or later are not waited for: they
 * cannot hold a reference to anything unlinked before the start (see the
 * argument below and in docs/rcu.md). New readers therefore never delay a
 * grace period, and because the sequence never wraps, one scan phase
 * suffices (liburcu's two-phase flip exists for its 1-bit phase).
 *
 * ---- Concurrency ----------------------------------------------------------
 * Lock order: gp_mutex -> registry lock (thread.c). The callback machinery
 * (callback.c) takes neither while holding the other; it is lock-free.
 *
 *   field                 written by                      read by
 *   gsi_gp_seq            driver, under gp_mutex          anyone (lock-free)
 *   gp_requested          gsi_gp_cookie() (atomic max)    driver
 *   gsi_gp_waiting        driver sets (gp_mutex) to the   reader unlock
 *                         start it sleeps on; the unlock
 *                         of a reader it waits for clears
 *   gp_events             driver: end of a GP, unlock     waiters kept out of
 *   gp_event_waiters      waiters (atomic inc/dec)        gp_mutex / driver
 *   reader->snap          owner thread                    driver, registry lock
 *   registry links        thread.c, registry lock         driver, registry lock
 *
 * The driver (whoever holds gp_mutex: gsi_gp_advance() with a try-lock, or
 * gp_wait() blocking) is the only writer of the sequence, so an odd
 * sequence means "a grace period is open"; any later holder of gp_mutex
 * continues it (that is what makes advance non-blocking: it may leave the
 * grace period open and return). The fork child resets gp_mutex.
 *
 * ---- Ordering, in short (docs/rcu.md has the full argument) ---------------
 * Updater U: unlinks p (store), then takes a cookie: F1 = seq_cst fence,
 * load seq. Driver D: W = seq_cst store seq = start; F2 = writer barrier
 * (seq_cst fence, or membarrier(2) which also executes a full barrier on
 * every running thread of the process); scan snapshots with acquire loads.
 * Reader R: S = snap store; F3 = read-side barrier (seq_cst fence, or a
 * compiler barrier that D's membarrier promotes); loads of the structure.
 *   - If D's scan reads R's snapshot < start: D waits until it reads 0 (or
 *     a later snapshot); those were stored with release, so all of R's
 *     critical section happens before the grace period ends.
 *   - Else D read 0/an older store or a snapshot >= start: by the
 *     store-buffering pairing F3/F2 (and F1 < W < F2 in the seq_cst order,
 *     since U's load read a value older than W), R's loads after F3 see U's
 *     unlink: R cannot reach p.
 * The end store seq = start+1 is a release; done() is an acquire load, so
 * the caller's reclaim happens after everything D observed.
 */
#include "rcu/engine.h"
#include "rcu/internal.h"
#include "graceslab.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <sched.h>

/* gsi_gp_seq and gsi_gp_waiting (engine.h). Exported for the inlined
   read side (from the shared library only: GS_INLINE_ABI); every access,
   here too, goes through the GOT (engine.h). A cache line of its own:
   readers load it on every outermost lock. */
GS_INLINE_ABI __attribute__((aligned(64))) struct gsi_rcu_gp_view gsi_rcu_gp_v3 = {
    .seq = GSI_GP_SEQ_BASE,
};
_Static_assert(sizeof(gsi_gp_seq) == sizeof(uint64_t) && sizeof(gsi_gp_waiting) == sizeof(uint32_t) &&
                   _Alignof(_Atomic uint64_t) == _Alignof(uint64_t) &&
                   _Alignof(_Atomic uint32_t) == _Alignof(uint32_t),
               "the inlined read side reads them as plain integers");

/* Serialises drivers. Never held across anything that may allocate. */
static pthread_mutex_t gp_mutex = PTHREAD_MUTEX_INITIALIZER;
/* Highest cookie handed out: tells gsi_gp_advance() a grace period is
   needed. Monotonic (atomic max); relaxed, it is only a hint: blocking
   waiters pass their own cookie to the driver. */
static _Atomic uint64_t gp_requested = GSI_GP_SEQ_BASE;

/* Waiters that find gp_mutex taken do not queue on it: they sleep on
   gp_events, which the holder bumps when it ends a grace period and when
   it lets go of the mutex, and check gsi_gp_done() each time. Queued on
   the mutex they could not see that their grace period had ended, and a
   driver that takes the mutex again at once (the lazy thread's expedite
   loop) kept a glibc mutex's woken waiter out for seconds (found in the
   thirteenth session's review: gs_synchronize_rcu took 4 s while 69 grace
   periods completed). gp_event_waiters counts the sleepers, so that a
   holder with nobody waiting makes no futex call. */
static _Atomic uint32_t gp_events;
static _Atomic uint32_t gp_event_waiters;

/* Spins (each one a scan) before the driver sleeps on gsi_gp_waiting. */
#define GP_SPINS 100
/* Safety net for the futex sleep; a wakeup is never needed to make
   progress, only to make it prompt. */
#define GP_SLEEP_NS 50000000L

void gsi_gp_writer_barrier(void)
{
    if (gsi_rcu_fences) {
        /* Pairs with the read side's seq_cst fences (reader.c). */
        atomic_thread_fence(memory_order_seq_cst);
        return;
    }
    /* Executes a full barrier on every CPU running a thread of this
       process, and on this one: pairs with the read side's compiler
       barriers (reader.c), promoting them to full barriers. */
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0)
        gsi_fatal_msg("gs_synchronize_rcu", "membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed");
}

uint64_t gsi_gp_cookie(void)
{
    /* Orders the caller's earlier stores (the unlink) before the load of
       the sequence: pairs with the writer barrier after the sequence store
       that starts the grace period this cookie names (F1 < W < F2). */
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t c = (atomic_load_explicit(&gsi_gp_seq, memory_order_relaxed) + 3) & ~(uint64_t)1;
    /* Relaxed atomic max: a hint for gsi_gp_advance(), no ordering needed. */
    uint64_t r = atomic_load_explicit(&gp_requested, memory_order_relaxed);
    while (r < c && !atomic_compare_exchange_weak_explicit(&gp_requested, &r, c,
                                                           memory_order_relaxed,
                                                           memory_order_relaxed))
        ;
    return c;
}

bool gsi_gp_done(uint64_t cookie)
{
    /* Acquire: pairs with the release store in gp_end_locked(); whatever
       the caller does after seeing true happens after the grace period. */
    return atomic_load_explicit(&gsi_gp_seq, memory_order_acquire) >= cookie;
}

uint64_t gsi_gp_started(void)
{
    /* Relaxed: a statistic. */
    uint64_t s = atomic_load_explicit(&gsi_gp_seq, memory_order_relaxed);
    return (s - GSI_GP_SEQ_BASE + 1) / 2;
}

uint64_t gsi_gp_completed(void)
{
    /* Relaxed: a statistic. */
    return (atomic_load_explicit(&gsi_gp_seq, memory_order_relaxed) - GSI_GP_SEQ_BASE) / 2;
}

/* s even, gp_mutex held. Returns the new (odd) value. */
static uint64_t gp_start_locked(uint64_t s)
{
    /* seq_cst store W: in the single total order after the F1 fence of
       every cookie that read a value below it, and before F2 below. Pairs
       with the readers' acquire load of the sequence. */
    atomic_store_explicit(&gsi_gp_seq, s + 1, memory_order_seq_cst);
    /* F2: pairs with the read-side barrier F3 in gs_rcu_read_lock(). */
    gsi_gp_writer_barrier();
    return s + 1;
}

/* Wakes the waiters sleeping on gp_events (see there). seq_cst RMW and
   load against the waiter's seq_cst increment and load of gp_events
   (store-buffering): either the waiter's load sees this bump, and its
   futex_wait returns at once, or this load sees its increment and wakes
   it. */
static void gp_event(void)
{
    atomic_fetch_add_explicit(&gp_events, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&gp_event_waiters, memory_order_seq_cst))
        gsi_futex_wake(&gp_events, INT32_MAX);
}

/* start odd, gp_mutex held. */
static void gp_end_locked(uint64_t start)
{
    /* Release: pairs with the acquire load in gsi_gp_done() (and the
       readers'); the scans that saw every pre-existing reader leave
       happen before it. */
    atomic_store_explicit(&gsi_gp_seq, start + 1, memory_order_release);
    gp_event();
}

static void gp_unlock(void)
{
    pthread_mutex_unlock(&gp_mutex);
    gp_event(); /* a waiter may drive now */
}

/* Does some reader that entered before `start` still hold the grace period
   open? gp_mutex held; takes the registry lock. */
static bool gp_readers_blocking_locked(uint64_t start)
{
    /* seq_cst: after the writer barrier that follows the start (and, when
       waiting, the store of gsi_gp_waiting); pairs with the seq_cst RMWs
       and fences of the anonymous sections (reader.c). */
    if (atomic_load_explicit(&gsi_rcu_anon_readers, memory_order_seq_cst) != 0)
        return true;
    bool blocked = false;
    gsi_rcu_registry_lock();
    for (struct gsi_rcu_reader *r = gsi_rcu_registry_first_locked(); r; r = r->next) {
        /* Acquire: pairs with the release stores of r->snap in
           gs_rcu_read_lock()/gs_rcu_read_unlock(). */
        uint64_t v = atomic_load_explicit(&r->snap, memory_order_acquire);
        if (v != 0 && v < start) {
            blocked = true;
            break;
        }
    }
    gsi_rcu_registry_unlock();
    return blocked;
}

/* Waits until no reader that entered before `start` is inside, spinning
   `spins` scans before it sleeps. gp_mutex held (kept across the sleep:
   only drivers need it). */
static void gp_wait_readers_locked(uint64_t start, unsigned spin_limit)
{
    /* What gsi_gp_waiting holds while we sleep: the low half of `start`
       (odd, so never 0). An unlock wakes us only if its snapshot is below
       it: only a reader this grace period waits for. With a bare flag every
       unlock woke us, and with readers entering and leaving all the time
       (most of them after the start, not waited for) the sleep returned at
       once: a loop of membarrier(2) and futex calls while a preempted
       reader kept the grace period open, a third of a CPU on two cores. */
    uint32_t mark = (uint32_t)start;
    for (unsigned spins = 0;; spins++) {
        if (!gp_readers_blocking_locked(start))
            break;
        if (spins < spin_limit) {
            for (int i = 0; i < 32; i++)
                gsi_cpu_relax();
            continue;
        }
        /* Relaxed store, ordered before the rescan by the writer barrier,
           which pairs with the barrier between the snapshot clear and the
           load of gsi_gp_waiting in gs_rcu_read_unlock(). */
        atomic_store_explicit(&gsi_gp_waiting, mark, memory_order_relaxed);
        gsi_gp_writer_barrier();
        if (!gp_readers_blocking_locked(start))
            break;
        struct timespec t = {0, GP_SLEEP_NS};
        gsi_futex_wait(&gsi_gp_waiting, mark, &t);
    }
    /* Relaxed: no unlock needs to wake anyone now (a stale mark would
       only cost them a compare, or a spurious wake once the low half
       wraps). */
    atomic_store_explicit(&gsi_gp_waiting, 0, memory_order_relaxed);
}

/* One non-blocking step: start a grace period if one is needed, end the
   open one if nothing blocks it. gp_mutex held. */
static void gp_try_locked(void)
{
    for (int round = 0; round < 2; round++) {
        uint64_t s = atomic_load_explicit(&gsi_gp_seq, memory_order_relaxed);
        if (!(s & 1)) {
            /* Relaxed: a hint (see gp_requested). */
            if (atomic_load_explicit(&gp_requested, memory_order_relaxed) <= s)
                return;
            s = gp_start_locked(s);
        }
        if (gp_readers_blocking_locked(s))
            return;
        gp_end_locked(s);
    }
}

void gsi_gp_advance(void)
{
    gsi_rcu_init(); /* the read-side mode decides the writer barrier */
    if (pthread_mutex_trylock(&gp_mutex) != 0)
        return;
    gp_try_locked();
    gp_unlock();
}

/* Blocks until gsi_gp_done(cookie). Not inside a read-side section. */
static void gp_wait(uint64_t cookie, unsigned spins)
{
    if (gsi_gp_done(cookie))
        return;
    gsi_rcu_init(); /* the read-side mode decides the writer barrier */
    for (;;) {
        /* seq_cst: see gp_event(). */
        atomic_fetch_add_explicit(&gp_event_waiters, 1, memory_order_seq_cst);
        uint32_t ev = atomic_load_explicit(&gp_events, memory_order_seq_cst);
        bool done = gsi_gp_done(cookie);
        if (done || pthread_mutex_trylock(&gp_mutex) == 0) {
            atomic_fetch_sub_explicit(&gp_event_waiters, 1, memory_order_relaxed);
            if (done)
                return; /* another driver ended it; the mutex was not taken */
            break;
        }
        /* Another driver holds the mutex: sleep until it ends a grace
           period or lets go (the timeout is a safety net only). */
        struct timespec t = {0, GP_SLEEP_NS};
        gsi_futex_wait(&gp_events, ev, &t);
        atomic_fetch_sub_explicit(&gp_event_waiters, 1, memory_order_relaxed);
    }
    while (!gsi_gp_done(cookie)) {
        uint64_t s = atomic_load_explicit(&gsi_gp_seq, memory_order_relaxed);
        if (!(s & 1))
            s = gp_start_locked(s);
        gp_wait_readers_locked(s, spins);
        gp_end_locked(s);
    }
    gp_unlock();
}

static void check_not_reader(const char *call)
{
    if (GS_UNLIKELY(gsi_rcu_in_reader()))
        gsi_fatal_msg(call, "called inside a read-side critical section");
}

void gsi_gp_wait(uint64_t cookie)
{
    check_not_reader("gsi_gp_wait");
    gp_wait(cookie, GP_SPINS);
}

void gsi_gp_wait_background(uint64_t cookie)
{
    check_not_reader("gsi_gp_wait");
    /* No spinning: nobody waits on this latency, and on a busy machine the
       spins took CPU from the very readers the grace period waited for
       (and pulled their records' cache lines away from them). */
    gp_wait(cookie, 0);
}

/* After a time-out (gsi_gp_wait_in_reader, or a wait owed to the unlock),
   the thread does not wait for that grace period again, nor at all for
   READER_BACKOFF_NS, unless its caller is past its cap (past_cap): a
   section that holds a lock which a reader of the grace period wants would
   otherwise time out on every call, and again on every grace period. */
#define READER_BACKOFF_NS 100000000u
static __thread uint64_t wait_in_reader_gave_up __attribute__((tls_model("initial-exec")));
static __thread uint64_t wait_in_reader_backoff_until __attribute__((tls_model("initial-exec")));
/* Sleep slice: between slices the waiter drives the grace period itself
   (gsi_gp_advance), in case nobody else does (the lazy thread busy with
   callbacks, or not running). */
#define READER_SLICE_NS 1000000u

/* Sleeps a slice at a time until the sequence is no longer `seq` (true)
   or the deadline passes (false), driving the grace period between
   slices. The callers' answer comes from gsi_gp_done() (acquire). */
static bool sleep_while_seq(uint64_t seq, uint64_t deadline)
{
    for (;;) {
        gsi_gp_advance(); /* non-blocking; ends it if nobody else would */
        /* Relaxed: decides only whether to keep waiting. */
        if (atomic_load_explicit(&gsi_gp_seq, memory_order_relaxed) != seq)
            return true;
        uint64_t now = gsi_now_ns();
        if (now >= deadline)
            return false;
        /* gp_wait()'s protocol for sleepers on gp_events: seq_cst
           increment of the count and load of gp_events, against
           gp_event()'s seq_cst bump and load of the count
           (store-buffering): either the end's bump is seen, and the futex
           returns at once, or the end sees this sleeper and wakes it. */
        atomic_fetch_add_explicit(&gp_event_waiters, 1, memory_order_seq_cst);
        uint32_t ev = atomic_load_explicit(&gp_events, memory_order_seq_cst);
        if (atomic_load_explicit(&gsi_gp_seq, memory_order_relaxed) == seq) {
            uint64_t left = deadline - now < READER_SLICE_NS ? deadline - now : READER_SLICE_NS;
            struct timespec t = {0, (long)left};
            gsi_futex_wait(&gp_events, ev, &t);
        }
        atomic_fetch_sub_explicit(&gp_event_waiters, 1, memory_order_relaxed);
    }
}

static uint64_t deadline_after(uint64_t now, uint64_t max_ns)
{
    return max_ns > UINT64_MAX - now ? UINT64_MAX : now + max_ns;
}

/* Waits owed to the unlock. When the grace period an allocation inside a
   section needs waits for that section, the allocation cannot wait for it
   and maps new memory instead; with more runnable threads than CPUs, the
   threads that allocate and defer inside short sections did so in bursts
   (92 new slabs in 100 ms among eight writers on 2 CPUs, and 28 MiB of
   peak RSS in the second half of one run of
   pending_membound/writers_inside_read_sections). So the allocation
   leaves the wait to the outermost unlock, which pays it after leaving
   the section: a writer maps at most one slab per grace period it cannot
   wait for inside. The wait is bounded and backs off after a time-out as
   the in-section one does: the caller may hold, outside its section, a
   lock that a reader of the grace period wants. Owner-only fields, no
   ordering; only in an outermost section, because the inlined nested
   lock and unlock (graceslab.h) rewrite `nested` with a plain load and
   store, and a signal handler's section, which is nested in the one it
   interrupts, would set the call bit in between and have it lost. */
static void owe_wait(uint64_t cookie, uint64_t max_ns, bool past_cap)
{
    struct gsi_rcu_reader *r = &gsi_rcu_self;
    if (!r->registered || gsi_rcu_depth_inner(r) != 0)
        return;
    if (cookie > r->owed.cookie)
        r->owed.cookie = cookie;
    if (max_ns > r->owed.max_ns)
        r->owed.max_ns = max_ns;
    r->owed.past_cap |= past_cap;
    gsi_rcu_reader_set_call(r, true); /* the inlined unlock calls the library */
}

/* Outermost unlock, still inside: at depth 0, so setting `nested` races
   with no inlined read-modify-write of it. */
void gsi_rcu_take_owed_wait(struct gsi_rcu_reader *r, struct gsi_rcu_owed_wait *w)
{
    *w = r->owed;
    r->owed = (struct gsi_rcu_owed_wait){0, 0, false};
    gsi_rcu_reader_set_call(r, !r->registered || gsi_rcu_fences);
}

void gsi_rcu_pay_owed_wait(const struct gsi_rcu_owed_wait *w)
{
    uint64_t cookie = w->cookie;
    if (gsi_gp_done(cookie))
        return;
    int saved_errno = errno;
    uint64_t now = gsi_now_ns();
    if (w->past_cap || now >= wait_in_reader_backoff_until) {
        uint64_t deadline = deadline_after(now, w->max_ns);
        while (!gsi_gp_done(cookie))
            if (!sleep_while_seq(atomic_load_explicit(&gsi_gp_seq, memory_order_relaxed),
                                 deadline)) {
                wait_in_reader_backoff_until = gsi_now_ns() + READER_BACKOFF_NS;
                break;
            }
    }
    errno = saved_errno;
}

bool gsi_gp_wait_in_reader(uint64_t cookie, uint64_t max_ns, bool past_cap)
{
    if (gsi_gp_done(cookie))
        return true;
    /* Relaxed: the thread's own record. Inside, the outermost lock's
       snapshot of the sequence: odd if a grace period was open then, and
       that one (start == snap) does not wait for this thread, which it
       scans as entered at its start (gp.c, reader.c). The anonymous mark
       makes every grace period wait. Only that grace period's end can
       complete cookies up to snap + 1; every later one waits for us. */
    uint64_t snap = atomic_load_explicit(&gsi_rcu_self.snap, memory_order_relaxed);
    if (snap == 0 || snap == GSI_RCU_SNAP_ANON || (snap == wait_in_reader_gave_up && !past_cap))
        return false;
    if (!(snap & 1) || cookie > snap + 1) {
        /* The grace period this needs waits for the caller: none was open
           when the section began, or a later one is needed. The unlock
           will wait for it (above). What holds the open one up may be a
           reader preempted inside its section; with more runnable threads
           than CPUs, the callers (threads past the pending threshold,
           allocating inside sections) went on allocating through that
           reader's whole time slice: 4 writers of 64 KiB blocks on 2 CPUs
           peaked at 190 to 390 MiB pending. Giving up the CPU once lets
           such a reader run and leave: mostly 19 to 53 MiB, at the same
           rate (pending_membound, medium blocks; docs/rcu.md). */
        owe_wait(cookie, max_ns, past_cap);
        sched_yield();
        return false;
    }
    int saved_errno = errno;
    uint64_t now = gsi_now_ns();
    if (now < wait_in_reader_backoff_until && !past_cap) {
        errno = saved_errno;
        return false;
    }
    if (!sleep_while_seq(snap, deadline_after(now, max_ns))) {
        wait_in_reader_gave_up = snap;
        wait_in_reader_backoff_until = gsi_now_ns() + READER_BACKOFF_NS;
    }
    errno = saved_errno;
    return gsi_gp_done(cookie);
}

GS_EXPORT void gs_synchronize_rcu(void)
{
    check_not_reader("gs_synchronize_rcu");
    gp_wait(gsi_gp_cookie(), GP_SPINS);
}

/* For callback.c (the lazy thread and gs_rcu_barrier() checks). */
void gsi_gp_check_not_reader(const char *call)
{
    check_not_reader(call);
}

GS_EXPORT unsigned long gs_rcu_get_state(void)
{
    return (unsigned long)gsi_gp_cookie();
}

GS_EXPORT bool gs_rcu_poll_state(unsigned long cookie)
{
    if (gsi_gp_done(cookie))
        return true;
    gsi_gp_advance();
    return gsi_gp_done(cookie);
}

void gsi_gp_atfork_child(void)
{
    /* The holder of gp_mutex may have vanished; an odd sequence stays a
       valid open grace period that the next driver continues. */
    pthread_mutex_init(&gp_mutex, NULL);
    atomic_store_explicit(&gsi_gp_waiting, 0, memory_order_relaxed);
    /* Its sleepers vanished with their threads. */
    atomic_store_explicit(&gp_event_waiters, 0, memory_order_relaxed);
}
