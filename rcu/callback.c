/*
 * Deferred callbacks and the lazy thread: gs_call_rcu(), gs_call_rcu_hurry(),
 * gs_rcu_barrier(), and the allocator's reclaim request/hook.
 *
 * Queue: a lock-free LIFO of intrusive heads (cb_stack). Enqueuers push with
 * a release CAS; the lazy thread takes the whole stack with one acquire
 * exchange, reverses it (FIFO), takes a cookie, waits for that grace period
 * and invokes the batch in order. Nothing allocates.
 *
 * Laziness: no thread exists until the first deferral. The thread then
 * sleeps on the futex word cb_event:
 *   - nothing queued: no timeout (zero wakeups while idle);
 *   - lazy callbacks queued: until `deadline` (the lazy timeout,
 *     GRACESLAB_RCU_LAZY_MS), unless hurried;
 *   - after a batch: it lingers one lazy timeout with a timer before going
 *     back to the untimed sleep, so a steady trickle of gs_call_rcu() is
 *     served by one timer wakeup per lazy timeout and never wakes it from
 *     the enqueue side.
 * Enqueuers wake it (event++, then FUTEX_WAKE if it sleeps) only when it
 * sleeps untimed, when hurried (gs_call_rcu_hurry, gs_rcu_barrier, the
 * batch bound GRACESLAB_RCU_LAZY_BATCH), or for a reclaim request.
 *
 * Lost-wakeup argument: the thread reads cb_event, stores cb_sleeping
 * (seq_cst), re-checks its condition, then FUTEX_WAITs on the value it read.
 * An enqueuer changes the condition (push / flag, seq_cst), increments
 * cb_event (seq_cst), then reads cb_sleeping (seq_cst). In the seq_cst
 * order either the enqueuer sees the thread sleeping (and wakes it; the
 * futex compare fails if the increment came first), or the thread's
 * re-check sees the new condition.
 *
 * Barrier: gs_rcu_barrier() queues a sentinel head (on its stack) hurried
 * and waits for it to run. Batches run in push order and one at a time, so
 * the sentinel runs after every callback pushed before it.
 *
 * Fork: the child has no lazy thread; cb_thread_state is reset and the next
 * deferral (or gs_rcu_barrier) creates it. A batch the parent's thread had
 * taken but not finished is pushed back in the child (cb_inflight), with
 * its reclaim request; fork waits (cb_take_mutex) while the thread is
 * between taking a batch and publishing it there. The barrier sentinels of
 * the parent's other threads are dropped (drop_dead_sentinels). A callback
 * running at the fork is the parent's: the child does not run it again.
 */
#include "rcu/engine.h"
#include "rcu/internal.h"
#include "graceslab.h"

#include <limits.h>
#include <sys/prctl.h>
#include <signal.h>
#include <stddef.h>

enum { THREAD_NONE, THREAD_STARTING, THREAD_RUNNING };
enum { AWAKE, SLEEP_TIMED, SLEEP_UNTIMED };

/* Queued heads, newest first. Pushed by anyone (release CAS), emptied by the
   lazy thread (acquire exchange). */
static _Atomic(struct gs_rcu_head *) cb_stack;
/* Callbacks queued / invoked, ever. queued: counted before the push
   (relaxed RMW; gs_rcu_barrier() reads it); invoked: counted after the
   callback returned (release, pairs with the acquire in gs_rcu_barrier()). */
static _Atomic uint64_t cb_queued, cb_invoked;
/* Queued count when the lazy thread last took the stack (lazy thread
   writes, enqueuers read for the batch bound; relaxed, a heuristic). */
static _Atomic uint64_t cb_taken;
/* Lazy thread's futex word; enqueuers increment it to wake it. */
static _Atomic uint32_t cb_event;
/* AWAKE / SLEEP_TIMED / SLEEP_UNTIMED: written by the lazy thread. */
static _Atomic uint32_t cb_sleeping;
/* Do not wait for the lazy timeout (set by hurry/barrier/batch bound,
   cleared by the lazy thread when it takes a batch). */
static _Atomic uint32_t cb_hurry;
/* The allocator asked for a grace period and a call of the hook. */
static _Atomic uint32_t cb_reclaim;
/* Until this time (gsi_now_ns()), the thread drives grace periods back to
   back: set by gsi_rcu_expedite(), 0 before. Part of the thread's
   condition: seq_cst, as cb_reclaim. */
static _Atomic uint64_t cb_expedite_until;
static _Atomic(void (*)(void)) reclaim_hook;
/* THREAD_NONE -> THREAD_STARTING (CAS, one creator) -> THREAD_RUNNING, or
   back to THREAD_NONE when the creation failed; a fork child goes back to
   THREAD_NONE (gsi_rcu_cb_atfork_child). */
static _Atomic int cb_thread_state;
/* The batch the lazy thread is working on, FIFO, not yet invoked, and
   whether the reclaim hook is still to run for it (only the lazy thread
   writes them; the fork child reads them). */
static _Atomic(struct gs_rcu_head *) cb_inflight;
static _Atomic uint32_t cb_inflight_reclaim;
/* Held by the lazy thread from taking a batch until it is published in
   cb_inflight, and by fork (gsi_rcu_cb_atfork_prepare): a fork in between
   left the batch in the lazy thread's locals only, and the child lost it
   (its callbacks never ran; gs_rcu_barrier returned anyway). */
static pthread_mutex_t cb_take_mutex = PTHREAD_MUTEX_INITIALIZER;
/* Wakeups of the lazy thread, ever (returns from its futex sleep). */
static _Atomic uint64_t lazy_wakeups;
/* gs_rcu_barrier() waiters sleep on this word; each sentinel bumps it. */
static _Atomic uint32_t barrier_event;

static __thread bool on_lazy_thread __attribute__((tls_model("initial-exec")));

/* Wakes the lazy thread if it sleeps (untimed_only: only an untimed sleep).
   Callers have already made their change visible with a seq_cst RMW. */
static void lazy_wake(bool untimed_only)
{
    /* seq_cst: see "Lost-wakeup argument" above; pairs with the thread's
       seq_cst store of cb_sleeping and its futex compare. */
    atomic_fetch_add_explicit(&cb_event, 1, memory_order_seq_cst);
    uint32_t sl = atomic_load_explicit(&cb_sleeping, memory_order_seq_cst);
    if (sl == SLEEP_UNTIMED || (sl == SLEEP_TIMED && !untimed_only))
        gsi_futex_wake(&cb_event, 1);
}

/* How long one gsi_rcu_expedite() keeps grace periods going. Long enough
   that a caller renews it rarely (the word is shared), short enough that
   the thread goes quiet soon after the last caller. */
#define EXPEDITE_NS 100000000u
/* Shortest time between the starts of two expedited grace periods. */
#define EXPEDITE_GAP_NS 1000000u

/* Is an expedite lease running at time now? seq_cst load: the thread's
   condition, see lazy_sleep(). */
static bool expediting(uint64_t now)
{
    return atomic_load_explicit(&cb_expedite_until, memory_order_seq_cst) > now;
}

/* Sleeps until woken or until deadline_ns (0: no timeout). */
static void lazy_sleep(uint32_t ev, uint64_t deadline_ns)
{
    uint32_t mode = deadline_ns ? SLEEP_TIMED : SLEEP_UNTIMED;
    /* seq_cst: pairs with the seq_cst load in lazy_wake(). */
    atomic_store_explicit(&cb_sleeping, mode, memory_order_seq_cst);
    /* Re-check after publishing the sleep (seq_cst loads: see above).
       A hurry counts only with work queued: it can outlive its request
       (set after lazy_process() took the batch it was for), and taken
       alone it kept the thread spinning here until the next request. */
    bool work = ((atomic_load_explicit(&cb_stack, memory_order_seq_cst) ||
                  atomic_load_explicit(&cb_reclaim, memory_order_seq_cst)) &&
                 (mode == SLEEP_UNTIMED || atomic_load_explicit(&cb_hurry, memory_order_seq_cst))) ||
                expediting(gsi_now_ns());
    if (!work) {
        struct timespec rel, *prel = NULL;
        if (deadline_ns) {
            uint64_t now = gsi_now_ns();
            uint64_t d = deadline_ns > now ? deadline_ns - now : 0;
            rel.tv_sec = (time_t)(d / 1000000000u);
            rel.tv_nsec = (long)(d % 1000000000u);
            prel = &rel;
        }
        if (!deadline_ns || prel->tv_sec || prel->tv_nsec) {
            /* A return without sleeping (an enqueue changed cb_event since
               the thread read it) is no wakeup: the thread never left the
               CPU. Relaxed: a statistic for tests and benchmarks. */
            if (gsi_futex_wait(&cb_event, ev, prel))
                atomic_fetch_add_explicit(&lazy_wakeups, 1, memory_order_relaxed);
        }
    }
    atomic_store_explicit(&cb_sleeping, AWAKE, memory_order_relaxed);
}

/* Takes the queue, waits for a grace period, calls the reclaim hook if it
   was requested, then invokes the batch in FIFO order. */
static void lazy_process(void)
{
    /* Relaxed: a hurry that arrives from now on finds the stack non-empty
       or is served by the next round anyway. */
    atomic_store_explicit(&cb_hurry, 0, memory_order_relaxed);
    pthread_mutex_lock(&cb_take_mutex);
    /* seq_cst (acquire at least): pairs with the release CAS in enqueue();
       the updaters' unlinks happen before the cookie below is taken. */
    struct gs_rcu_head *h = atomic_exchange_explicit(&cb_stack, NULL, memory_order_seq_cst);
    /* seq_cst, after the stack: a reclaim requested before a push we just
       took is seen now, so a gs_rcu_barrier() queued after
       gsi_rcu_request_reclaim() returns only after the hook ran. */
    bool reclaim = atomic_exchange_explicit(&cb_reclaim, 0, memory_order_seq_cst);
    struct gs_rcu_head *fifo = NULL;
    uint64_t n = 0;
    while (h) {
        struct gs_rcu_head *next = h->next;
        h->next = fifo;
        fifo = h;
        h = next;
        n++;
    }
    /* Relaxed: heuristic for the batch bound. */
    atomic_fetch_add_explicit(&cb_taken, n, memory_order_relaxed);
    /* Relaxed: only this thread and the fork child (a memory snapshot,
       taken with cb_take_mutex held) read them. */
    atomic_store_explicit(&cb_inflight, fifo, memory_order_relaxed);
    atomic_store_explicit(&cb_inflight_reclaim, reclaim, memory_order_relaxed);
    pthread_mutex_unlock(&cb_take_mutex);
    gsi_gp_wait(gsi_gp_cookie());
    if (reclaim) {
        /* Acquire: pairs with the release store in gsi_rcu_set_reclaim_hook(). */
        void (*hook)(void) = atomic_load_explicit(&reclaim_hook, memory_order_acquire);
        if (hook)
            hook();
        atomic_store_explicit(&cb_inflight_reclaim, 0, memory_order_relaxed);
    }
    while (fifo) {
        struct gs_rcu_head *next = fifo->next;
        atomic_store_explicit(&cb_inflight, next, memory_order_relaxed);
        fifo->func(fifo);
        /* Release: pairs with the acquire in gs_rcu_barrier()'s fast path;
           the callback's effects happen before a barrier that counts it. */
        atomic_fetch_add_explicit(&cb_invoked, 1, memory_order_release);
        fifo = next;
    }
}

static void *lazy_main(void *arg)
{
    (void)arg;
    on_lazy_thread = true;
    /* Named, so that tools (and rcu_wakeups) can tell it apart. */
    prctl(PR_SET_NAME, "gs-rcu-lazy", 0, 0, 0);
    uint64_t lazy_ns = (uint64_t)gsi_option(GSI_OPT_RCU_LAZY_MS) * 1000000u;
    uint64_t deadline = 0; /* 0: idle, no timer */
    for (;;) {
        /* seq_cst: read before the condition; see lazy_sleep(). */
        uint32_t ev = atomic_load_explicit(&cb_event, memory_order_seq_cst);
        bool have = atomic_load_explicit(&cb_stack, memory_order_seq_cst) ||
                    atomic_load_explicit(&cb_reclaim, memory_order_seq_cst);
        bool hurry = atomic_load_explicit(&cb_hurry, memory_order_seq_cst);
        uint64_t now = gsi_now_ns();
        if (have && (hurry || (deadline && now >= deadline))) {
            lazy_process();
            deadline = gsi_now_ns() + lazy_ns; /* linger one timeout */
            continue;
        }
        if (have && !deadline)
            deadline = now + lazy_ns;
        else if (!have && deadline && now >= deadline)
            deadline = 0; /* lingered long enough: go idle */
        if (expediting(now)) {
            /* Grace periods only: the allocator that asked reclaims on its
               own refills. After the batch check and the deadline, so a
               lease renewed without end never delays callbacks. Paced: one
               grace period per EXPEDITE_GAP_NS at most (back to back, most
               ended at once, each with a membarrier(2): 35,000 a second
               cost a third of the allocating threads' throughput). */
            gsi_gp_wait_background(gsi_gp_cookie());
            uint64_t spent = gsi_now_ns() - now;
            if (spent < EXPEDITE_GAP_NS) {
                struct timespec gap = {0, (long)(EXPEDITE_GAP_NS - spent)};
                nanosleep(&gap, NULL);
            }
            continue;
        }
        lazy_sleep(ev, deadline);
    }
    return NULL;
}

/* Set by the first caller whose callbacks need the lazy thread (gs_call_rcu
   and friends); from then on a creation that fails is fatal for every
   creator, also for the allocator's quiet requests. A fork child keeps it
   only if it inherited callbacks. */
static atomic_bool cb_thread_needed;

/* create_thread() with every signal blocked. Returns false when the
   caller must look again (another caller was elected first, or this
   creation failed while a caller needs the thread), true otherwise: the
   thread runs, or its creation failed quietly and the state is back to
   THREAD_NONE (a fatal creation that fails aborts). */
static bool create_thread_blocked(bool fatal)
{
    int expected = THREAD_NONE;
    /* seq_cst (it only elects one creator): part of the total order the
       argument in ensure_thread() uses. */
    if (!atomic_compare_exchange_strong_explicit(&cb_thread_state, &expected, THREAD_STARTING,
                                                 memory_order_seq_cst, memory_order_seq_cst))
        return false;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int err = pthread_create(&t, &attr, lazy_main, NULL);
    pthread_attr_destroy(&attr);
    if (err == 0) {
        /* Release: pairs with the acquire load in ensure_thread(). */
        atomic_store_explicit(&cb_thread_state, THREAD_RUNNING, memory_order_release);
        return true;
    }
    if (fatal)
        gsi_fatal_msg("gs_call_rcu", "cannot create the RCU callback thread");
    /* seq_cst store, then seq_cst load of the mark: pairs with the mark's
       store and the state's load in ensure_thread() (store buffering,
       argued there). A caller that needs the thread may have returned
       seeing THREAD_STARTING: look again, as a fatal creator. */
    atomic_store_explicit(&cb_thread_state, THREAD_NONE, memory_order_seq_cst);
    return !atomic_load_explicit(&cb_thread_needed, memory_order_seq_cst);
}

/* Creates the lazy thread if no other caller is doing so (see
   create_thread_blocked for the result). Every signal is blocked from the
   election to the final store: the new thread must not take the process's
   signals (it inherits the mask), and a handler on this thread must not
   run while the state says THREAD_STARTING. A handler that forked there
   left the child with the state reset by the fork handler and then set
   to THREAD_RUNNING by the resumed creator, with no thread (its callbacks
   never ran), or with two lazy threads when the child's handler created
   one and the resumed creator another (a review helper's reproducers). */
static bool create_thread(bool fatal)
{
    /* Before the state leaves THREAD_NONE: init registers the fork
       handlers, and a fork between the CAS below and that registration
       left the child with THREAD_STARTING and no handler to reset it (no
       lazy thread ever again: callbacks never ran, gs_rcu_barrier hung). */
    gsi_rcu_init();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    bool done = create_thread_blocked(fatal);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return done;
}

/* Starts the lazy thread if needed. When it cannot be created (out of
   memory, thread limits): fatal for callers whose callbacks could never run
   otherwise, a no-op for the allocator's reclaim request (the allocator
   reclaims on its own slow paths too, and asks again later).

   Nobody waits for another creator: the creation can allocate (glibc's
   pthread_create callocs the thread's TLS vector), the allocation wait for a
   grace period, and that grace period for a caller inside a read-side
   section; a signal handler can also interrupt the creator on its own
   thread. So a fatal caller that finds the creation under way marks the
   thread needed and returns, and a creator that fails looks at the mark.
   Store buffering, all seq_cst: caller `needed = 1; load state`, failed
   creator `state = NONE; load needed`. Either the caller sees NONE (or a
   later creator's STARTING, itself bound by the same rule) and creates the
   thread itself, or the creator sees the mark and looks again as a fatal
   creator: aborts if it fails, as that caller would have. Before, the
   caller returned with no mark, and a failed quiet creation left its
   callback with no thread to run it (gs_rcu_barrier hung; a stress
   helper's case, RLIMIT_AS too small for a stack). */
static void ensure_thread(bool fatal)
{
    /* Acquire: pairs with the release store of THREAD_RUNNING in
       create_thread() (the thread exists). */
    if (GS_LIKELY(atomic_load_explicit(&cb_thread_state, memory_order_acquire) == THREAD_RUNNING))
        return;
    if (fatal) /* not the fast path: only before the thread runs */
        atomic_store_explicit(&cb_thread_needed, true, memory_order_seq_cst);
    for (;;) {
        int state = atomic_load_explicit(&cb_thread_state, memory_order_seq_cst);
        if (state != THREAD_NONE)
            return; /* running, or a creator that will see the mark */
        if (create_thread(fatal))
            return;
        /* Elected out, or failed while the thread is needed: then the next
           creation is fatal (seq_cst, as the creator's load of the mark). */
        fatal = fatal || atomic_load_explicit(&cb_thread_needed, memory_order_seq_cst);
    }
}

static void enqueue(struct gs_rcu_head *h, void (*fn)(struct gs_rcu_head *), bool hurry)
{
    h->func = fn;
    h->cookie = 0;
    /* Relaxed: counted before the push, so a callback that is invoked has
       been counted (gs_rcu_barrier()'s fast path relies on it). */
    uint64_t n = atomic_fetch_add_explicit(&cb_queued, 1, memory_order_relaxed) + 1;
    struct gs_rcu_head *old = atomic_load_explicit(&cb_stack, memory_order_relaxed);
    do {
        h->next = old;
        /* seq_cst (a release at least): publishes *h and everything the
           caller did before (the unlink) to the lazy thread's acquire
           exchange; seq_cst for the lost-wakeup argument. */
    } while (!atomic_compare_exchange_weak_explicit(&cb_stack, &old, h, memory_order_seq_cst,
                                                    memory_order_relaxed));
    ensure_thread(true);
    long batch = gsi_option(GSI_OPT_RCU_LAZY_BATCH);
    /* Relaxed: a heuristic; exactly one enqueuer sees the bound. */
    if (!hurry && batch > 0 &&
        n - atomic_load_explicit(&cb_taken, memory_order_relaxed) == (uint64_t)batch)
        hurry = true;
    if (hurry) {
        /* seq_cst: lost-wakeup argument. */
        atomic_store_explicit(&cb_hurry, 1, memory_order_seq_cst);
        lazy_wake(false);
    } else {
        lazy_wake(true);
    }
}

GS_EXPORT void gs_call_rcu(struct gs_rcu_head *h, void (*fn)(struct gs_rcu_head *))
{
    enqueue(h, fn, false);
}

GS_EXPORT void gs_call_rcu_hurry(struct gs_rcu_head *h, void (*fn)(struct gs_rcu_head *))
{
    enqueue(h, fn, true);
}

struct barrier_sentinel {
    struct gs_rcu_head head;
    _Atomic uint32_t done;
    /* The waiting thread: the address of its on_lazy_thread, unique among
       running threads and kept by a fork child (see
       drop_dead_sentinels). */
    const bool *waiter;
};

static struct barrier_sentinel *sentinel_of(struct gs_rcu_head *h)
{
    return (struct barrier_sentinel *)((char *)h - offsetof(struct barrier_sentinel, head));
}

static void barrier_done(struct gs_rcu_head *h)
{
    struct barrier_sentinel *b = sentinel_of(h);
    /* Release: pairs with the acquire load in gs_rcu_barrier(); every
       earlier callback of the FIFO has returned. */
    atomic_store_explicit(&b->done, 1, memory_order_release);
    /* seq_cst: the waiter reads barrier_event before re-checking done, so
       either it sees done or the futex compare fails. */
    atomic_fetch_add_explicit(&barrier_event, 1, memory_order_seq_cst);
    gsi_futex_wake(&barrier_event, INT_MAX);
}

GS_EXPORT void gs_rcu_barrier(void)
{
    gsi_gp_check_not_reader("gs_rcu_barrier");
    if (GS_UNLIKELY(on_lazy_thread))
        gsi_fatal_msg("gs_rcu_barrier", "called from an RCU callback");
    /* Fast path: everything ever queued has been invoked. Acquire loads
       pair with the release increment of cb_invoked; the FIFO order makes
       "invoked >= queued-at-entry" imply each earlier callback ran. */
    uint64_t q = atomic_load_explicit(&cb_queued, memory_order_acquire);
    if (atomic_load_explicit(&cb_invoked, memory_order_acquire) >= q)
        return;
    struct barrier_sentinel b;
    atomic_init(&b.done, 0);
    b.waiter = &on_lazy_thread;
    enqueue(&b.head, barrier_done, true);
    for (;;) {
        /* seq_cst: pairs with the increment in barrier_done(). */
        uint32_t ev = atomic_load_explicit(&barrier_event, memory_order_seq_cst);
        /* Acquire: pairs with the release store in barrier_done(). */
        if (atomic_load_explicit(&b.done, memory_order_acquire))
            break;
        gsi_futex_wait(&barrier_event, ev, NULL);
    }
}

void gsi_rcu_set_reclaim_hook(void (*hook)(void))
{
    /* Release: pairs with the acquire load in lazy_process(). */
    atomic_store_explicit(&reclaim_hook, hook, memory_order_release);
}

void gsi_rcu_request_reclaim(void)
{
    /* seq_cst: lost-wakeup argument (the flag is the thread's condition). */
    if (atomic_exchange_explicit(&cb_reclaim, 1, memory_order_seq_cst) &&
        atomic_load_explicit(&cb_thread_state, memory_order_relaxed) == THREAD_RUNNING)
        return; /* already requested; the thread will see it */
    ensure_thread(false);
    lazy_wake(true);
}

void gsi_rcu_expedite(void)
{
    uint64_t now = gsi_now_ns();
    /* Relaxed: only decides whether to renew. Renewed at most once per
       tenth of the lease, so callers rarely write the shared word. */
    uint64_t until = atomic_load_explicit(&cb_expedite_until, memory_order_relaxed);
    if (until > now + EXPEDITE_NS - EXPEDITE_NS / 10 &&
        atomic_load_explicit(&cb_thread_state, memory_order_relaxed) == THREAD_RUNNING)
        return;
    /* seq_cst: the thread's condition (lost-wakeup argument). Racing
       renewals store nearly the same time; either one will do. */
    atomic_store_explicit(&cb_expedite_until, now + EXPEDITE_NS, memory_order_seq_cst);
    ensure_thread(false);
    lazy_wake(false);
}

bool gsi_gp_wait_or_expedite(uint64_t cookie)
{
    if (gsi_rcu_in_reader()) {
        gsi_rcu_expedite();
        return false;
    }
    gsi_gp_wait(cookie);
    return true;
}

uint64_t gsi_rcu_lazy_wakeups(void)
{
    return atomic_load_explicit(&lazy_wakeups, memory_order_relaxed);
}

uint64_t gsi_rcu_callbacks_outstanding(void)
{
    /* Invoked first: a callback counted invoked was counted queued
       before, so the difference does not wrap (outside a fork child's
       handler, which lowers queued with no other thread running). */
    uint64_t invoked = atomic_load_explicit(&cb_invoked, memory_order_acquire);
    return atomic_load_explicit(&cb_queued, memory_order_acquire) - invoked;
}

bool gsi_rcu_lazy_thread_exists(void)
{
    return atomic_load_explicit(&cb_thread_state, memory_order_relaxed) != THREAD_NONE;
}

void gsi_rcu_cb_atfork_prepare(void)
{
    pthread_mutex_lock(&cb_take_mutex);
}

void gsi_rcu_cb_atfork_parent(void)
{
    pthread_mutex_unlock(&cb_take_mutex);
}

/* A fork child inherits the barrier sentinels of the parent's threads
   that were waiting in gs_rcu_barrier(). Those threads do not exist in
   the child, and each sentinel lives on its thread's stack, which glibc
   then reuses for a new thread or unmaps: the child's lazy thread would
   call through, and write into, whatever is there (a helper's reproducer,
   thirty-second session: SIGSEGV in the child's lazy thread). The memory
   is intact still (glibc reclaims the stacks in the child before the
   handlers, but reuses them only later), so the sentinels are unlinked
   here, and no longer counted as queued. The forking thread's own
   sentinel (a fork from a handler that interrupted its barrier) stays. */
static struct gs_rcu_head *drop_dead_sentinels(struct gs_rcu_head *list)
{
    struct gs_rcu_head **link = &list;
    uint64_t dropped = 0, left = 0;
    while (*link) {
        struct gs_rcu_head *h = *link;
        if (h->func == barrier_done && sentinel_of(h)->waiter != &on_lazy_thread) {
            *link = h->next;
            dropped++;
        } else {
            link = &h->next;
            left++;
        }
    }
    uint64_t queued = atomic_load_explicit(&cb_queued, memory_order_relaxed) - dropped;
    atomic_store_explicit(&cb_queued, queued, memory_order_relaxed);
    /* And what is left is not taken yet (the batch bound counts from
       here; the parent's thread had counted its batch as taken). */
    atomic_store_explicit(&cb_taken, queued - left, memory_order_relaxed);
    return list;
}

void gsi_rcu_cb_atfork_child(void)
{
    /* Only this thread exists; plain (relaxed) accesses suffice. The
       parent's lazy thread is gone: give its unfinished batch back to the
       queue (newest first: push in reverse FIFO order) and let the next
       deferral create a new thread. */
    struct gs_rcu_head *fifo = atomic_load_explicit(&cb_inflight, memory_order_relaxed);
    struct gs_rcu_head *stack = atomic_load_explicit(&cb_stack, memory_order_relaxed);
    struct gs_rcu_head *rev = NULL;
    while (fifo) {
        struct gs_rcu_head *next = fifo->next;
        fifo->next = rev;
        rev = fifo;
        fifo = next;
    }
    /* rev is the batch newest first; the batch is older than everything
       on the stack, so it goes below the stack's oldest entry. */
    if (!stack) {
        stack = rev;
    } else {
        struct gs_rcu_head *tail = stack;
        while (tail->next)
            tail = tail->next;
        tail->next = rev;
    }
    stack = drop_dead_sentinels(stack);
    atomic_store_explicit(&cb_stack, stack, memory_order_relaxed);
    atomic_store_explicit(&cb_inflight, NULL, memory_order_relaxed);
    /* The child needs its thread only for callbacks it has: a child with
       none keeps the allocator's quiet requests quiet (a failed creation
       there aborted a child that never deferred a callback). */
    atomic_store_explicit(&cb_thread_needed, stack != NULL, memory_order_relaxed);
    /* A reclaim request the parent's thread had taken and not served. */
    if (atomic_load_explicit(&cb_inflight_reclaim, memory_order_relaxed))
        atomic_store_explicit(&cb_reclaim, 1, memory_order_relaxed);
    atomic_store_explicit(&cb_inflight_reclaim, 0, memory_order_relaxed);
    pthread_mutex_unlock(&cb_take_mutex); /* taken by this thread in prepare */
    atomic_store_explicit(&cb_thread_state, THREAD_NONE, memory_order_relaxed);
    atomic_store_explicit(&cb_sleeping, AWAKE, memory_order_relaxed);
    on_lazy_thread = false;
}
