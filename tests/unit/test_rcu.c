/*
 * Unit tests of the grace-period engine (rcu/). Linked with the static
 * library so that the internal interface (rcu/internal.h) is reachable too.
 * meson runs this binary twice: as is (membarrier read side when the kernel
 * has it) and with GRACESLAB_RCU_FENCES=1 (fence read side), both with
 * GRACESLAB_RCU_LAZY_MS=30000 so that "did not wait for the lazy timeout"
 * is a functional, not a timing, property. Under ThreadSanitizer it is
 * built against rcu_mini_criterion.h (Criterion cannot run under TSan).
 */
#ifdef GS_RCU_MINI_CRITERION
#include <stdbool.h>
#include "rcu_mini_criterion.h"
#else
#include <criterion/criterion.h>
#endif

#include "graceslab.h"
#include "alloc/common.h"
#include "rcu/engine.h"
#include "rcu/internal.h"
#include "../common.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

/* A thread that enters a read-side section, says so, and stays until told. */
struct holder {
    pthread_t t;
    atomic_int inside;
    atomic_int release;
};

static void *holder_main(void *arg)
{
    struct holder *h = arg;
    /* Register first, so that the lock below is a registered thread's:
       in the test_rcu_inline build that is the inline fast path (a first
       lock goes through the library). */
    gs_rcu_register_thread();
    gs_rcu_read_lock();
    atomic_store(&h->inside, 1);
    while (!atomic_load(&h->release))
        sleep_ms(1);
    gs_rcu_read_unlock();
    atomic_store(&h->inside, 0);
    return NULL;
}

static void holder_start(struct holder *h)
{
    atomic_init(&h->inside, 0);
    atomic_init(&h->release, 0);
    cr_assert_eq(pthread_create(&h->t, NULL, holder_main, h), 0);
    while (!atomic_load(&h->inside))
        sleep_ms(1);
}

static void holder_stop(struct holder *h)
{
    atomic_store(&h->release, 1);
    pthread_join(h->t, NULL);
}


Test(rcu, mode_matches_option)
{
    gs_rcu_read_lock();
    gs_rcu_read_unlock();
    const char *f = getenv("GRACESLAB_RCU_FENCES");
    if (f && strcmp(f, "1") == 0)
        cr_assert(gsi_rcu_fences, "GRACESLAB_RCU_FENCES=1 must select the fence read side");
    else if (!GS_TSAN)
        cr_log_info("read side: %s", gsi_rcu_fences ? "fences" : "membarrier");
    if (GS_TSAN)
        cr_assert(gsi_rcu_fences, "TSan builds must use the fence read side");
}

Test(rcu, nesting)
{
    cr_assert_not(gsi_rcu_in_reader());
    gs_rcu_read_lock();
    gs_rcu_read_lock();
    cr_assert(gsi_rcu_in_reader());
    gs_rcu_read_unlock();
    cr_assert(gsi_rcu_in_reader(), "still inside after one of two unlocks");
    gs_rcu_read_unlock();
    cr_assert_not(gsi_rcu_in_reader());
    /* A grace period completes once the outermost unlock has run. */
    gs_synchronize_rcu();
}

Test(rcu, nested_reader_holds_gp)
{
    struct holder h;
    holder_start(&h); /* depth 1 in the holder */
    uint64_t c = gsi_gp_cookie();
    for (int i = 0; i < 50; i++) {
        gsi_gp_advance();
        sleep_ms(2);
    }
    cr_assert_not(gsi_gp_done(c), "grace period ended under a pre-existing reader");
    holder_stop(&h);
    gsi_gp_wait(c);
    cr_assert(gsi_gp_done(c));
}

Test(rcu, poll_state_only_after_full_gp)
{
    /* Outside any reader, a cookie completes once a GP has run. */
    unsigned long c0 = gs_rcu_get_state();
    uint64_t completed0 = gsi_gp_completed();
    gs_synchronize_rcu();
    cr_assert(gs_rcu_poll_state(c0));
    cr_assert_geq(gsi_gp_completed(), completed0 + 1);

    /* With a reader inside, a cookie taken now must not complete. */
    struct holder h;
    holder_start(&h);
    unsigned long c = gs_rcu_get_state();
    cr_assert_not(gs_rcu_poll_state(c), "fresh cookie already done");
    for (int i = 0; i < 100; i++) {
        cr_assert_not(gs_rcu_poll_state(c), "poll true while a pre-existing reader is inside");
        sleep_ms(1);
    }
    /* A cookie taken while a GP is open needs the *next* GP: even after the
       open one ends it is not done until one more completes. */
    uint64_t seq = atomic_load(&gsi_gp_seq);
    cr_assert(seq & 1, "polling should have started a grace period");
    holder_stop(&h);
    int polls = 0;
    while (!gs_rcu_poll_state(c)) {
        polls++;
        sleep_ms(1);
        cr_assert_lt(polls, 10000, "poll never turned true");
    }
    cr_assert_geq(atomic_load(&gsi_gp_seq), (uint64_t)c);
    /* Done stays done. */
    gs_synchronize_rcu();
    cr_assert(gs_rcu_poll_state(c));
}

Test(rcu, gp_waits_for_preexisting_reader)
{
    struct holder h;
    struct gst_syncer s;
    holder_start(&h);
    cr_assert(gst_syncer_start(&s));
    sleep_ms(200);
    cr_assert_not(atomic_load(&s.done), "gs_synchronize_rcu() returned under a pre-existing reader");
    holder_stop(&h);
    pthread_join(s.t, NULL);
    cr_assert(atomic_load(&s.done));
}

Test(rcu, gp_does_not_wait_for_new_readers)
{
    struct holder old, young;
    struct gst_syncer s;
    uint64_t started = gsi_gp_started();
    holder_start(&old);
    cr_assert(gst_syncer_start(&s));
    /* Wait until the syncer has started its grace period... */
    while (gsi_gp_started() == started)
        sleep_ms(1);
    /* ...then a new reader enters and never leaves while we wait. */
    holder_start(&young);
    sleep_ms(50);
    cr_assert_not(atomic_load(&s.done));
    holder_stop(&old);
    /* The grace period must end although `young` is still inside. */
    for (int i = 0; i < 20000 && !atomic_load(&s.done); i++)
        sleep_ms(1);
    cr_assert(atomic_load(&s.done), "a reader that entered after the GP started blocked it");
    cr_assert(atomic_load(&young.inside));
    pthread_join(s.t, NULL);
    holder_stop(&young);
}

/* gsi_gp_wait_in_reader(): inside a section, the allocator may wait for
   the grace period in progress when that one started before the section
   (it does not wait for the section), and must never wait for one that
   does. */

/* Waits until a grace period is open (the syncer's), returns its start. */
static uint64_t open_grace_period(uint64_t started_before)
{
    while (gsi_gp_started() == started_before)
        sleep_ms(1);
    uint64_t start = atomic_load(&gsi_gp_seq);
    cr_assert(start & 1, "no grace period open");
    return start;
}

/* Registers, has `old` enter a section and a syncer open a grace period,
   then enters a section itself, after the start: that grace period does
   not wait for this thread. Returns its start. */
static uint64_t enter_after_start(struct holder *old, struct gst_syncer *s)
{
    gs_rcu_register_thread();
    uint64_t started = gsi_gp_started();
    holder_start(old);
    cr_assert(gst_syncer_start(s));
    uint64_t start = open_grace_period(started);
    gs_rcu_read_lock();
    return start;
}

/* A bound no test waits out: a wait that should not happen times the
   test out. */
#define HOUR_NS ((uint64_t)3600 * 1000000000u)

static void *release_later(void *arg)
{
    sleep_ms(100);
    holder_stop(arg);
    return NULL;
}

Test(rcu, wait_in_reader_waits_for_the_grace_period_it_does_not_hold, .timeout = 60)
{
    struct holder old;
    struct gst_syncer s;
    uint64_t start = enter_after_start(&old, &s);
    pthread_t rel;
    cr_assert_eq(pthread_create(&rel, NULL, release_later, &old), 0);
    errno = 1234;
    cr_assert(gsi_gp_wait_in_reader(start + 1, HOUR_NS, false),
              "the grace period in progress did not end although only `old` held it");
    cr_assert_eq(errno, 1234, "errno changed");
    cr_assert(gsi_gp_done(start + 1));
    /* (`inside` is cleared after the unlock: the flag it was told to
       leave by, set before, is what the end must follow.) */
    cr_assert(atomic_load(&old.release), "the grace period ended before `old` was let go");
    cr_assert(gsi_rcu_in_reader());
    /* Every later grace period waits for this section: refused at once. */
    cr_assert_not(gsi_gp_wait_in_reader(gsi_gp_cookie(), HOUR_NS, false));
    gs_rcu_read_unlock();
    pthread_join(rel, NULL);
    pthread_join(s.t, NULL);
    gs_rcu_unregister_thread();
}

Test(rcu, wait_in_reader_never_waits_for_a_grace_period_it_holds, .timeout = 60)
{
    gs_rcu_register_thread();
    /* Outside a section: only the answer, no wait. */
    cr_assert_not(gsi_gp_wait_in_reader(gsi_gp_cookie(), HOUR_NS, false));
    gs_rcu_read_lock(); /* before the start: the grace period waits for us */
    struct gst_syncer s;
    uint64_t started = gsi_gp_started();
    cr_assert(gst_syncer_start(&s));
    uint64_t start = open_grace_period(started);
    cr_assert_not(gsi_gp_wait_in_reader(start + 1, HOUR_NS, false),
                  "waited for a grace period that waits for the caller");
    cr_assert_not(atomic_load(&s.done));
    gs_rcu_read_unlock();
    pthread_join(s.t, NULL);
    cr_assert(gsi_gp_done(start + 1));
}

Test(rcu, wait_in_reader_is_bounded_and_gives_up_once, .timeout = 60)
{
    struct holder old;
    struct gst_syncer s;
    uint64_t start = enter_after_start(&old, &s);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_not(gsi_gp_wait_in_reader(start + 1, 200000000u, false),
                  "the grace period ended with `old` still inside");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    cr_assert_geq(waited, 0.2, "gave up after %.3f s of a 0.2 s bound", waited);
    /* The same grace period again: given up already. */
    cr_assert_not(gsi_gp_wait_in_reader(start + 1, HOUR_NS, false));
    gs_rcu_read_unlock();
    holder_stop(&old);
    pthread_join(s.t, NULL);
    gs_rcu_unregister_thread();
}

/* Nobody drives the grace period (no syncer, no lazy thread): the waiter
   ends it itself once the reader it waited for has left. (It used to
   sleep out its whole bound.) */
Test(rcu, wait_in_reader_drives_the_grace_period_itself, .timeout = 60)
{
    gs_rcu_register_thread();
    struct holder old;
    holder_start(&old);
    uint64_t c = gsi_gp_cookie();
    gsi_gp_advance(); /* starts it; `old` keeps it open */
    uint64_t start = atomic_load(&gsi_gp_seq);
    cr_assert(start & 1, "no grace period open");
    cr_assert_not(gsi_gp_done(c));
    gs_rcu_read_lock();
    pthread_t rel;
    cr_assert_eq(pthread_create(&rel, NULL, release_later, &old), 0);
    cr_assert(gsi_gp_wait_in_reader(start + 1, HOUR_NS, false), "the grace period did not end");
    cr_assert(gsi_gp_done(c));
    gs_rcu_read_unlock();
    pthread_join(rel, NULL);
    gs_rcu_unregister_thread();
}

/* A wait the grace period needs the caller for is left to the caller's
   outermost unlock, which makes it after leaving the section (nobody else
   drives grace periods here). In the inline build the unlocks are the
   inlined ones: the call bit must send the outermost one to the library. */
Test(rcu, wait_in_reader_leaves_a_wait_it_cannot_make_to_the_unlock, .timeout = 60)
{
    gs_rcu_register_thread();
    unsigned long nested_outside = gsi_rcu_self.nested; /* the call bit or 0 */
    gs_rcu_read_lock();
    uint64_t c = gsi_gp_cookie(); /* its grace period waits for this section */
    cr_assert_not(gsi_gp_wait_in_reader(c, HOUR_NS, false));
    cr_assert_eq(gsi_rcu_self.owed.cookie, c);
    /* A nested section's unlock must not wait: it would wait for itself
       (the test then times out). */
    gs_rcu_read_lock();
    gs_rcu_read_unlock();
    cr_assert(gsi_rcu_in_reader());
    cr_assert_not(gsi_gp_done(c));
    errno = 4321;
    gs_rcu_read_unlock();
    cr_assert(gsi_gp_done(c), "the outermost unlock did not wait for the grace period");
    cr_assert_eq(errno, 4321, "errno changed");
    /* Paid once: nothing owed, and the read side back as it was. */
    cr_assert_eq(gsi_rcu_self.owed.cookie, 0);
    cr_assert_eq(gsi_rcu_self.nested, nested_outside, "the call bit was left changed");
    uint64_t seq = atomic_load(&gsi_gp_seq);
    gs_rcu_read_lock();
    gs_rcu_read_unlock();
    cr_assert_eq(atomic_load(&gsi_gp_seq), seq, "an unlock that owed nothing drove a grace period");
    /* Inside a nested section nothing is owed (a signal handler's section
       is nested in the one it interrupts: gp.c, owe_wait). */
    gs_rcu_read_lock();
    gs_rcu_read_lock();
    uint64_t c2 = gsi_gp_cookie();
    cr_assert_not(gsi_gp_wait_in_reader(c2, HOUR_NS, false));
    cr_assert_eq(gsi_rcu_self.owed.cookie, 0, "a nested section owed a wait");
    gs_rcu_read_unlock();
    gs_rcu_read_unlock();
    cr_assert_not(gsi_gp_done(c2));
    gs_rcu_unregister_thread();
}

/* After a time-out the thread waits for nothing for 100 ms, inside a
   section or at its unlock, unless its caller is past its cap. */
Test(rcu, waits_past_the_cap_ignore_the_back_off, .timeout = 60)
{
    struct holder old;
    struct gst_syncer s;
    /* A wait owed to the unlock within the back-off is not made. The
       back-off lasts 100 ms from the time-out: a try whose unlock came
       later (a loaded machine) proves nothing and is made again. */
    bool within = false;
    for (int try = 0; try < 20 && !within; try++) {
        uint64_t start = enter_after_start(&old, &s);
        cr_assert_not(gsi_gp_wait_in_reader(start + 1, 20000000u, false),
                      "the grace period ended with `old` still inside");
        double t_out = gst_now_s(); /* a time-out: the back-off starts */
        gs_rcu_read_unlock();
        holder_stop(&old);
        pthread_join(s.t, NULL); /* the open grace period ended; nobody drives now */
        gs_rcu_read_lock();
        uint64_t c = gsi_gp_cookie();
        cr_assert_not(gsi_gp_wait_in_reader(c, HOUR_NS, false));
        cr_assert_eq(gsi_rcu_self.owed.cookie, c);
        gs_rcu_read_unlock();
        within = gst_now_s() - t_out < 0.09;
        if (within)
            cr_assert_not(gsi_gp_done(c), "the unlock waited within the back-off");
        else {
            gs_synchronize_rcu(); /* done with it either way */
            sleep_ms(110); /* so that the next try's time-out is one */
        }
    }
    cr_assert(within, "no try reached the unlock within 90 ms of its time-out");
    /* ...unless the caller is past its cap. */
    gs_rcu_read_lock();
    uint64_t c2 = gsi_gp_cookie();
    cr_assert_not(gsi_gp_wait_in_reader(c2, HOUR_NS, true));
    gs_rcu_read_unlock();
    cr_assert(gsi_gp_done(c2), "the unlock past the cap did not wait");
    /* Inside a section: a grace period given up on (a time-out just now,
       so within the back-off too) is waited for past the cap. */
    holder_start(&old);
    uint64_t started = gsi_gp_started();
    cr_assert(gst_syncer_start(&s));
    uint64_t start = open_grace_period(started);
    gs_rcu_read_lock();
    cr_assert_not(gsi_gp_wait_in_reader(start + 1, 20000000u, false));
    pthread_t rel;
    cr_assert_eq(pthread_create(&rel, NULL, release_later, &old), 0);
    cr_assert(gsi_gp_wait_in_reader(start + 1, HOUR_NS, true),
              "the wait past the cap gave up within the back-off");
    cr_assert(atomic_load(&old.release));
    gs_rcu_read_unlock();
    pthread_join(rel, NULL);
    pthread_join(s.t, NULL);
    gs_rcu_unregister_thread();
}

Test(rcu, only_waited_readers_wake_the_driver)
{
    /* Registered now, so that the sections below are not anonymous ones
       (whose unlock always wakes the driver). */
    gs_rcu_register_thread();
    struct holder old;
    struct gst_syncer s;
    holder_start(&old);
    cr_assert(gst_syncer_start(&s));
    /* The syncer spins, then sleeps with its mark in gsi_gp_waiting. */
    for (int i = 0; i < 20000 && !atomic_load(&gsi_gp_waiting); i++)
        sleep_ms(1);
    uint32_t mark = atomic_load(&gsi_gp_waiting);
    cr_assert(mark != 0, "the driver never slept");
    /* Sections that began after the grace period started leave it asleep
       (each of their unlocks used to wake it, only for it to find `old`
       still inside). */
    for (int i = 0; i < 1000; i++) {
        gs_rcu_read_lock();
        gs_rcu_read_unlock();
    }
    cr_assert_eq(atomic_load(&gsi_gp_waiting), mark,
                 "the unlock of a reader the grace period does not wait for woke the driver");
    cr_assert_not(atomic_load(&s.done));
    /* The reader it waits for wakes it. */
    holder_stop(&old);
    pthread_join(s.t, NULL);
    cr_assert(atomic_load(&s.done));
    gs_rcu_unregister_thread();
}

Test(rcu, expedite_drives_grace_periods_then_stops)
{
    /* Nobody drives grace periods in this process: a cookie stays pending. */
    uint64_t c = gsi_gp_cookie();
    sleep_ms(100);
    cr_assert_not(gsi_gp_done(c), "a grace period completed with nobody driving it");
    /* The allocator's call from inside a reader: the lazy thread drives. */
    gs_rcu_read_lock();
    gsi_rcu_expedite();
    gs_rcu_read_unlock();
    for (int i = 0; i < 20000 && !gsi_gp_done(c); i++)
        sleep_ms(1);
    cr_assert(gsi_gp_done(c), "gsi_rcu_expedite() did not get a grace period completed");
    /* The lease (100 ms) runs out and the thread goes quiet again. */
    sleep_ms(1000);
    uint64_t started = gsi_gp_started();
    sleep_ms(500);
    cr_assert_eq(gsi_gp_started(), started, "grace periods went on after the lease ended");
}

/* Readers that keep asking for grace periods from inside 100 us sections
   (busy, so that 8 of them on a few CPUs are preempted inside), as
   allocating readers do: the lazy thread runs grace periods back to back. */
static atomic_int leasing_stop;
static void *leasing_reader(void *arg)
{
    (void)arg;
    while (!atomic_load(&leasing_stop)) {
        gs_rcu_read_lock();
        gsi_rcu_expedite();
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do
            clock_gettime(CLOCK_MONOTONIC, &t);
        while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 100000);
        gs_rcu_read_unlock();
    }
    return NULL;
}

/* gs_synchronize_rcu returns once a grace period that started after the
   call has ended, even while another driver runs grace periods back to
   back. It used to queue on the driver's mutex, where it could not see
   its grace period end, and the driver kept taking the mutex again before
   it woke: 2 to 6 s, with 38 to 134 grace periods completed meanwhile
   (8 runs of this on 2 CPUs; 2 after the fix). */
Test(rcu, synchronize_not_starved_by_busy_driver)
{
    pthread_t t[8];
    atomic_store(&leasing_stop, 0);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, leasing_reader, NULL), 0);
    sleep_ms(50);
    uint64_t worst = 0;
    for (int i = 0; i < 30; i++) {
        uint64_t g0 = gsi_gp_completed();
        gs_synchronize_rcu();
        uint64_t g = gsi_gp_completed() - g0;
        worst = g > worst ? g : worst;
    }
    atomic_store(&leasing_stop, 1);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    /* Two suffice (the open one, then one that starts after the call);
       the rest is slack for a waiter woken late on a loaded machine. */
    cr_assert(worst <= 10, "%llu grace periods completed during one gs_synchronize_rcu",
              (unsigned long long)worst);
}

static atomic_int cb_runs;
static void count_cb(struct gs_rcu_head *h)
{
    (void)h;
    atomic_fetch_add(&cb_runs, 1);
}

Test(rcu, call_rcu_runs_after_gp)
{
    static struct gs_rcu_head head;
    struct holder h;
    holder_start(&h);
    gs_call_rcu_hurry(&head, count_cb);
    sleep_ms(200);
    cr_assert_eq(atomic_load(&cb_runs), 0, "callback ran under a pre-existing reader");
    holder_stop(&h);
    gs_rcu_barrier();
    cr_assert_eq(atomic_load(&cb_runs), 1);
    cr_assert_eq(head.func, count_cb);
}

Test(rcu, lazy_call_rcu_waits_barrier_does_not)
{
    long lazy_ms = gsi_option(GSI_OPT_RCU_LAZY_MS);
    static struct gs_rcu_head heads[10];
    for (int i = 0; i < 10; i++)
        gs_call_rcu(&heads[i], count_cb);
    if (lazy_ms >= 10000) {
        sleep_ms(300);
        cr_assert_eq(atomic_load(&cb_runs), 0, "lazy callbacks ran before the lazy timeout");
    }
    gs_rcu_barrier();
    cr_assert_eq(atomic_load(&cb_runs), 10);
}

Test(rcu, hurry_does_not_wait_for_lazy_timeout)
{
    long lazy_ms = gsi_option(GSI_OPT_RCU_LAZY_MS);
    cr_assert_geq(lazy_ms, 10000, "run with GRACESLAB_RCU_LAZY_MS >= 10000 (meson does)");
    static struct gs_rcu_head lazy, hurry;
    gs_call_rcu(&lazy, count_cb); /* a lazy one queued first */
    gs_call_rcu_hurry(&hurry, count_cb);
    /* Both must run long before the lazy timeout: hurry flushes the queue. */
    for (long waited = 0; atomic_load(&cb_runs) < 2; waited++) {
        cr_assert_lt(waited, lazy_ms / 2, "hurry waited for the lazy timeout");
        sleep_ms(1);
    }
    cr_assert_eq(atomic_load(&cb_runs), 2);
}

/* gs_rcu_barrier() waits for every earlier callback, from several threads,
   including ones that cannot run yet because a reader holds the GP. */
#define BAR_THREADS 4
#define BAR_EACH 2000
static struct gs_rcu_head bar_heads[BAR_THREADS][BAR_EACH];

static void *bar_enqueuer(void *arg)
{
    long t = (long)arg;
    for (int i = 0; i < BAR_EACH; i++) {
        if (i % 7 == 0)
            gs_call_rcu_hurry(&bar_heads[t][i], count_cb);
        else
            gs_call_rcu(&bar_heads[t][i], count_cb);
    }
    return NULL;
}

struct barrier_thread {
    pthread_t t;
    atomic_int done;
    int seen;
};

static void *barrier_main(void *arg)
{
    struct barrier_thread *b = arg;
    gs_rcu_barrier();
    b->seen = atomic_load(&cb_runs);
    atomic_store(&b->done, 1);
    return NULL;
}

Test(rcu, barrier_waits_for_every_earlier_callback)
{
    struct holder h;
    holder_start(&h);
    pthread_t t[BAR_THREADS];
    for (long i = 0; i < BAR_THREADS; i++)
        pthread_create(&t[i], NULL, bar_enqueuer, (void *)i);
    for (int i = 0; i < BAR_THREADS; i++)
        pthread_join(t[i], NULL);
    struct barrier_thread b = {.seen = -1};
    atomic_init(&b.done, 0);
    pthread_create(&b.t, NULL, barrier_main, &b);
    sleep_ms(200);
    cr_assert_not(atomic_load(&b.done), "barrier returned while callbacks were blocked by a reader");
    holder_stop(&h);
    pthread_join(b.t, NULL);
    cr_assert_eq(b.seen, BAR_THREADS * BAR_EACH);
    /* Nothing pending: a barrier returns at once. */
    gs_rcu_barrier();
    cr_assert_eq(atomic_load(&cb_runs), BAR_THREADS * BAR_EACH);
}

Test(rcu, no_thread_until_deferral)
{
    gs_rcu_read_lock();
    gs_rcu_read_unlock();
    gs_synchronize_rcu();
    unsigned long c = gs_rcu_get_state();
    while (!gs_rcu_poll_state(c))
        sleep_ms(1);
    gs_rcu_barrier(); /* nothing ever queued */
    cr_assert_not(gsi_rcu_lazy_thread_exists(),
                  "the engine created a thread although nothing was deferred");
    static struct gs_rcu_head head;
    gs_call_rcu_hurry(&head, count_cb);
    cr_assert(gsi_rcu_lazy_thread_exists());
    gs_rcu_barrier();
    cr_assert_eq(atomic_load(&cb_runs), 1);
}

static atomic_int hook_calls;
static void reclaim_hook(void)
{
    atomic_fetch_add(&hook_calls, 1);
}

Test(rcu, reclaim_hook_after_gp)
{
    /* The allocator installs its own hook at startup; replace it here. */
    gsi_rcu_set_reclaim_hook(reclaim_hook);
    uint64_t c = gsi_gp_cookie();
    gsi_rcu_request_reclaim();
    /* Bounded by the lazy timeout; barrier hurries the thread. */
    static struct gs_rcu_head head;
    gs_call_rcu_hurry(&head, count_cb);
    gs_rcu_barrier();
    cr_assert_eq(atomic_load(&hook_calls), 1, "hook not called exactly once");
    cr_assert(gsi_gp_done(c));
}

/* ---- Misuse: run in a forked child, capture stderr, expect SIGABRT. ---- */

static void expect_abort(void (*fn)(void), const char *needle)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        alarm(20);
        fn();
        _exit(0);
    }
    close(p[1]);
    char buf[1024];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(p[0], buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = 0;
    close(p[0]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "child did not abort (status %d), stderr: %s",
              st, buf);
    cr_assert(strstr(buf, needle) != NULL, "stderr lacks \"%s\": %s", needle, buf);
}

static void misuse_sync_in_reader(void)
{
    gs_rcu_read_lock();
    gs_synchronize_rcu();
}

static void misuse_barrier_in_reader(void)
{
    gs_rcu_read_lock();
    gs_rcu_barrier();
}

static void misuse_unbalanced_unlock(void)
{
    gs_rcu_read_lock();
    gs_rcu_read_unlock();
    gs_rcu_read_unlock();
}

static void misuse_unlock_first(void)
{
    gs_rcu_read_unlock();
}

static void misuse_wait_in_reader(void)
{
    gs_rcu_read_lock();
    gsi_gp_wait(gsi_gp_cookie());
}

static void misuse_unregister_in_reader(void)
{
    gs_rcu_register_thread();
    gs_rcu_read_lock();
    gs_rcu_unregister_thread();
}

static void *exit_inside(void *arg)
{
    (void)arg;
    gs_rcu_read_lock();
    return NULL; /* thread exits inside the critical section */
}

static void misuse_exit_in_reader(void)
{
    pthread_t t;
    pthread_create(&t, NULL, exit_inside, NULL);
    pthread_join(t, NULL);
}
/* The same in an anonymous section: the thread's first lock finds the
   registry lock taken. */
static void misuse_exit_in_anonymous_section(void)
{
    gsi_rcu_registry_lock();
    pthread_t t;
    pthread_create(&t, NULL, exit_inside, NULL);
    pthread_join(t, NULL);
    gsi_rcu_registry_unlock();
}

Test(rcu, misuse_aborts_with_clear_line)
{
    expect_abort(misuse_sync_in_reader,
                 "graceslab: gs_synchronize_rcu(): called inside a read-side critical section\n");
    expect_abort(misuse_barrier_in_reader,
                 "graceslab: gs_rcu_barrier(): called inside a read-side critical section\n");
    expect_abort(misuse_unbalanced_unlock, "graceslab: gs_rcu_read_unlock(): unbalanced unlock");
    expect_abort(misuse_unlock_first, "graceslab: gs_rcu_read_unlock(): unbalanced unlock");
    expect_abort(misuse_wait_in_reader,
                 "graceslab: gsi_gp_wait(): called inside a read-side critical section\n");
    expect_abort(misuse_unregister_in_reader,
                 "graceslab: gs_rcu_unregister_thread(): called inside an RCU read-side critical section\n");
    expect_abort(misuse_exit_in_reader,
                 "graceslab: pthread_exit(): thread exited inside an RCU read-side critical section\n");
    expect_abort(misuse_exit_in_anonymous_section,
                 "graceslab: pthread_exit(): thread exited inside an RCU read-side critical section\n");
}

/* No thread can be created (every default stack is 2^50 bytes: the
   mapping itself fails, whatever the overcommit setting): a thread that
   keeps making the allocator's quiet request for the lazy thread (whose
   failure is not fatal) races gs_call_rcu, which must abort rather than
   return with no thread to run its callback. It used to return when it
   found the quiet request's creation under way, which then failed:
   gs_rcu_barrier waited for good (9 hangs in 10 runs; a stress helper's
   case, with gs_free_rcu making the requests). */
static void *deferrer(void *arg)
{
    (void)arg;
    for (;;) /* until the process aborts */
        gsi_rcu_request_reclaim();
    return NULL;
}

static void call_rcu_with_no_thread_possible(void)
{
    pthread_attr_t huge, small;
    pthread_attr_init(&huge);
    pthread_attr_setstacksize(&huge, (size_t)1 << 50);
    if (pthread_setattr_default_np(&huge) != 0)
        _exit(3);
    pthread_attr_init(&small);
    pthread_attr_setstacksize(&small, 256 << 10);
    pthread_t t;
    if (pthread_create(&t, &small, deferrer, NULL) != 0)
        _exit(4);
    usleep(20000);
    static struct gs_rcu_head head;
    gs_call_rcu(&head, count_cb);
    gs_rcu_barrier(); /* hangs if gs_call_rcu returned with no thread */
}

Test(rcu, call_rcu_aborts_when_no_thread_can_start, .timeout = 200)
{
    for (int i = 0; i < 5; i++)
        expect_abort(call_rcu_with_no_thread_possible,
                     "graceslab: gs_call_rcu(): cannot create the RCU callback thread\n");
}

/* A fork child that inherited no callback keeps the allocator's requests
   for the lazy thread quiet: where no thread can be created, a request
   returns. The mark that makes a failed creation fatal once a callback
   needs the thread came into the child with the parent's memory, and the
   child aborted with a gs_call_rcu() line although it had queued nothing
   (a review helper's case). */
Test(rcu, fork_child_without_callbacks_keeps_requests_quiet)
{
    static struct gs_rcu_head head;
    gs_call_rcu_hurry(&head, count_cb);
    gs_rcu_barrier(); /* nothing left queued */
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        pthread_attr_t huge;
        pthread_attr_init(&huge);
        pthread_attr_setstacksize(&huge, (size_t)1 << 50);
        if (pthread_setattr_default_np(&huge) != 0)
            _exit(3);
        alarm(20);
        gsi_rcu_request_reclaim(); /* the creation fails: must return */
        _exit(gsi_rcu_lazy_thread_exists() ? 4 : 0);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "the child of a parent whose callbacks all ran did not return from a failed "
              "quiet request (status %d)", st);
}

/* A fork child of a parent whose threads wait in gs_rcu_barrier()
   inherits their sentinels, which live on those threads' stacks; glibc
   gives the stacks of the threads the child lacks to the child's new
   threads of the same stack size. The child's lazy thread must not run
   those sentinels: it wrote into a new thread's stack (filled with 0xAB
   and checked here) or, where glibc unmapped the stacks, crashed (a bug
   hunt helper's case). The child must also not count them as queued.
   Left out of TSan's small runner: TSan cannot follow a fork child's
   threads that take the parent's thread ids ("dup thread with used id"). */
#ifndef GS_RCU_MINI_CRITERION
#define BARRIER_WAITERS 8
#define WAITER_STACK ((size_t)1 << 20)
#define FILLER_BYTES ((size_t)768 << 10)
static _Atomic int slow_started, slow_release, fillers_go;

static void slow_cb(struct gs_rcu_head *h)
{
    (void)h;
    atomic_store(&slow_started, 1);
    /* Holds the barriers queued behind it until the parent has forked. */
    while (!atomic_load(&slow_release))
        usleep(1000);
}

static void *stack_filler(void *arg)
{
    (void)arg;
    volatile unsigned char *buf = __builtin_alloca(FILLER_BYTES);
    memset((void *)buf, 0xAB, FILLER_BYTES);
    while (!atomic_load(&fillers_go))
        usleep(1000);
    for (size_t i = 0; i < FILLER_BYTES; i++)
        if (buf[i] != 0xAB)
            return (void *)1;
    return NULL;
}

Test(rcu, fork_child_drops_the_barriers_of_lost_threads, .timeout = 60)
{
    /* One explicit stack size for waiters and fillers: glibc's default
       depends on RLIMIT_STACK, and a cached stack goes to a thread that
       asks for the same size. */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, WAITER_STACK);
    static struct gs_rcu_head slow;
    gs_call_rcu_hurry(&slow, slow_cb);
    while (!atomic_load(&slow_started))
        usleep(1000);
    static struct barrier_thread w[BARRIER_WAITERS];
    for (int i = 0; i < BARRIER_WAITERS; i++)
        cr_assert_eq(pthread_create(&w[i].t, &attr, barrier_main, &w[i]), 0);
    /* Every waiter has queued its sentinel behind the running callback. */
    for (int i = 0; i < 10000 && gsi_rcu_callbacks_outstanding() < 1 + BARRIER_WAITERS; i++)
        usleep(1000);
    cr_assert_eq(gsi_rcu_callbacks_outstanding(), 1 + BARRIER_WAITERS);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(20);
        /* Only the callback the parent's thread was running is left
           counted: the child does not run it again. */
        bool counted = gsi_rcu_callbacks_outstanding() != 1;
        /* The new threads take the lost threads' stacks from glibc's cache
           and cover the sentinels' frames. */
        pthread_t f[BARRIER_WAITERS];
        for (int i = 0; i < BARRIER_WAITERS; i++)
            if (pthread_create(&f[i], &attr, stack_filler, NULL) != 0)
                _exit(3);
        usleep(200000);
        gs_rcu_barrier(); /* runs what the child inherited */
        atomic_store(&fillers_go, 1);
        int bad = 0;
        for (int i = 0; i < BARRIER_WAITERS; i++) {
            void *r;
            pthread_join(f[i], &r);
            bad += r != NULL;
        }
        _exit(bad ? 4 : counted ? 5 : 0);
    }
    atomic_store(&slow_release, 1);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    for (int i = 0; i < BARRIER_WAITERS; i++)
        pthread_join(w[i].t, NULL);
    pthread_attr_destroy(&attr);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "the fork child ran or counted the barrier sentinels of threads it does not "
              "have (status %d; exit 4: a new thread's stack overwritten, 5: sentinels "
              "still counted)", st);
}
#endif

/* A thread's first read lock allocates nothing, even when the program
   made 40 thread-specific keys first: glibc allocates a thread's
   second-level key block at the first pthread_setspecific of a key from
   the 33rd on, and the engine's key (armed by that first lock) used to be
   made at the first use, after the program's. In a signal handler that
   allocation re-entered an interrupted malloc. Not in the sanitizer
   builds, where malloc (and so glibc's calloc) is the sanitizer's and
   graceslab cannot count it: skipped under ASan, left out under TSan's
   small runner (no skip there). */
#ifndef GS_RCU_MINI_CRITERION
static size_t live_blocks_of_class(size_t size)
{
    struct gs_stats st;
    gs_stats_get(&st);
    for (unsigned i = 0; i < st.nclasses; i++)
        if (st.class_size[i] == size)
            return st.class_allocated[i];
    return 0;
}

static void *first_read_lock(void *arg)
{
    size_t *grew = arg;
    free(malloc(16)); /* the thread's heap exists before the count */
    size_t before = live_blocks_of_class(512); /* glibc's block: 32 x 16 bytes */
    gs_rcu_read_lock();
    size_t inside = live_blocks_of_class(512);
    gs_rcu_read_unlock();
    *grew = inside - before;
    return NULL;
}

Test(rcu, first_read_lock_allocates_nothing_after_many_keys)
{
#if defined(__SANITIZE_ADDRESS__)
    cr_skip_test("malloc is ASan's in this build: glibc's calloc cannot be counted");
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    cr_skip_test("malloc is ASan's in this build: glibc's calloc cannot be counted");
#endif
#endif
    pthread_key_t k;
    for (int i = 0; i < 40; i++)
        cr_assert_eq(pthread_key_create(&k, NULL), 0);
    size_t grew = 99;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, first_read_lock, &grew), 0);
    pthread_join(t, NULL);
    cr_assert_eq(grew, 0, "the first read lock allocated %zu block(s) of 512 bytes", grew);
}
#endif

Test(rcu, register_unregister)
{
    gs_rcu_register_thread();
    gs_rcu_register_thread(); /* idempotent */
    gs_rcu_unregister_thread();
    gs_rcu_unregister_thread(); /* idempotent */
    gs_rcu_read_lock();         /* re-registers */
    cr_assert(gsi_rcu_self.registered);
    gs_rcu_read_unlock();
    gs_synchronize_rcu();
}

/* ---- The record as the inlined read side (GRACESLAB_RCU_INLINE) sees it.
   In the test_rcu_inline build every gs_rcu_read_lock/unlock here is the
   header's inline version; in test_rcu, the library's. Either way the
   record must hold what the inline version reads. ---- */

static void *view_thread(void *arg)
{
    int *failed = arg;
    struct gsi_rcu_reader *r = &gsi_rcu_self;
    struct gsi_rcu_reader_view *v = &gsi_rcu_self_view_v3;
    /* This file declares the two names as two objects (only the library's
       alias attribute says they are one), so the compiler may keep a
       field read through r across a write through v (the inline read
       side): at -O2 it did, and the check after an unlock read a stale
       nested. A compiler barrier before each check makes every read
       fresh; the library, and a program using the inline side, name the
       record one way each. */
#define CHECK(c)                                                                  \
    do {                                                                          \
        __asm__ volatile("" ::: "memory");                                        \
        if (!(c)) {                                                               \
            *failed = __LINE__;                                                   \
            return NULL;                                                          \
        }                                                                         \
    } while (0)
    CHECK((void *)v == (void *)r);        /* one object, two names */
    /* A new thread's record: the call bit set, so that the inline lock
       calls the library, which registers it. */
    CHECK(!r->registered && r->nested == GSI_RCU_NESTED_CALL && atomic_load(&r->snap) == 0);
    gs_rcu_read_lock();                   /* first use: registers */
    /* The bit the inline side takes its fast path on: registered and
       membarrier mode (chosen by the first use, above). */
    const unsigned long call = gsi_rcu_fences ? GSI_RCU_NESTED_CALL : 0;
    CHECK(r->registered && r->nested == call);
    CHECK(atomic_load(&r->snap) != 0 && atomic_load(&r->snap) <= atomic_load(&gsi_gp_seq));
    CHECK(gsi_rcu_in_reader());
    gs_rcu_read_lock();
    CHECK(r->nested == (call | 1));
    gs_rcu_read_unlock();
    CHECK(r->nested == call && atomic_load(&r->snap) != 0);
    gs_rcu_read_unlock();
    CHECK(r->nested == call && atomic_load(&r->snap) == 0 && !gsi_rcu_in_reader());
    gs_rcu_unregister_thread();
    CHECK(!r->registered && r->nested == GSI_RCU_NESTED_CALL);
    gs_rcu_read_lock();                   /* re-registers */
    CHECK(r->registered && r->nested == call && atomic_load(&r->snap) != 0);
    gs_rcu_read_unlock();
    CHECK(r->nested == call && atomic_load(&r->snap) == 0);
#undef CHECK
    return NULL;
}

Test(rcu, reader_record_as_the_inline_side_reads_it)
{
    int failed = 0;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, view_thread, &failed), 0);
    pthread_join(t, NULL);
    cr_assert_eq(failed, 0, "check at test_rcu.c:%d failed", failed);
}

/* ---- Signal handlers as readers. A handler may take the read side at any
   point of the thread it interrupts: in the middle of gs_rcu_read_lock()
   or unlock(), and during the thread's first lock, which registers it. ---- */

static atomic_int sig_hits;

static void reader_handler(int sig)
{
    (void)sig;
    gs_rcu_read_lock();
    atomic_fetch_add(&sig_hits, 1);
    gs_rcu_read_unlock();
}

static void handle_with_reader(int sig)
{
    struct sigaction sa = {.sa_handler = reader_handler};
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(sig, &sa, NULL), 0);
}

/* Records in the registry, following next and checking every prev; -1 if
   the list is malformed (a record linked twice makes a cycle). */
static int registry_count_locked(void)
{
    int n = 0;
    struct gsi_rcu_reader *prev = NULL;
    for (struct gsi_rcu_reader *r = gsi_rcu_registry_first_locked(); r; r = r->next) {
        if (r->prev != prev || ++n > 100000)
            return -1;
        prev = r;
    }
    return n;
}

/* Fails the test if it has not finished in `seconds` (a deadlock). */
static void deadlock_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test_rcu: no progress before the alarm (deadlock)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

static void fail_after(unsigned seconds)
{
    signal(SIGALRM, deadlock_alarm);
    alarm(seconds);
}

/* What the handler saw: the thread's record and the anonymous count. */
static atomic_int seen_anon, seen_registered;
static atomic_ulong seen_count;

static void observing_handler(int sig)
{
    (void)sig;
    gs_rcu_read_lock();
    atomic_store(&seen_anon, atomic_load(&gsi_rcu_self.snap) == GSI_RCU_SNAP_ANON);
    atomic_store(&seen_registered, gsi_rcu_self.registered);
    atomic_store(&seen_count, atomic_load(&gsi_rcu_anon_readers));
    atomic_fetch_add(&sig_hits, 1);
    gs_rcu_read_unlock();
}

/* The handler interrupts code that holds the registry lock on its own,
   unregistered thread (as a grace-period scan or a fork does): it must
   not wait for the lock, and runs an anonymous section. */
Test(rcu, handler_while_own_thread_holds_registry_lock)
{
    fail_after(30);
    gs_synchronize_rcu(); /* engine initialised; this thread stays unregistered */
    cr_assert_not(gsi_rcu_self.registered);
    struct sigaction sa = {.sa_handler = observing_handler};
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
    gsi_rcu_registry_lock();
    raise(SIGUSR1); /* delivered before raise() returns */
    gsi_rcu_registry_unlock();
    cr_assert_eq(atomic_load(&sig_hits), 1);
    cr_assert(atomic_load(&seen_anon));
    cr_assert_not(atomic_load(&seen_registered));
    cr_assert_eq(atomic_load(&seen_count), 1);
    cr_assert_eq(atomic_load(&gsi_rcu_anon_readers), 0);
    cr_assert_eq(atomic_load(&gsi_rcu_self.snap), 0);
    gs_rcu_read_lock(); /* the lock is free now: registers */
    cr_assert(gsi_rcu_self.registered && gsi_rcu_self.snap != GSI_RCU_SNAP_ANON);
    gs_rcu_read_unlock();
}

struct anon_reader {
    pthread_t t;
    atomic_int inside, release;
    atomic_int was_anon;
};

static void *anon_reader_main(void *arg)
{
    struct anon_reader *a = arg;
    gs_rcu_read_lock(); /* first lock, registry lock busy: anonymous */
    gs_rcu_read_lock(); /* nests */
    atomic_store(&a->was_anon, atomic_load(&gsi_rcu_self.snap) == GSI_RCU_SNAP_ANON &&
                                   !gsi_rcu_self.registered && gsi_rcu_in_reader());
    atomic_store(&a->inside, 1);
    while (!atomic_load(&a->release))
        sleep_ms(1);
    gs_rcu_read_unlock();
    gs_rcu_read_unlock();
    atomic_store(&a->inside, 0);
    return NULL;
}

/* A first lock that finds the registry lock busy does not wait for it; the
   grace periods that start while its anonymous section runs wait for it. */
Test(rcu, anonymous_section_holds_gp)
{
    fail_after(60);
    gs_synchronize_rcu();
    struct anon_reader a;
    atomic_init(&a.inside, 0);
    atomic_init(&a.release, 0);
    atomic_init(&a.was_anon, 0);
    gsi_rcu_registry_lock();
    cr_assert_eq(pthread_create(&a.t, NULL, anon_reader_main, &a), 0);
    while (!atomic_load(&a.inside)) /* would hang if the lock waited */
        sleep_ms(1);
    gsi_rcu_registry_unlock();
    cr_assert(atomic_load(&a.was_anon));
    cr_assert_eq(atomic_load(&gsi_rcu_anon_readers), 1);
    struct gst_syncer sy;
    cr_assert(gst_syncer_start(&sy));
    sleep_ms(200);
    cr_assert_not(atomic_load(&sy.done), "grace period ended inside an anonymous section");
    atomic_store(&a.release, 1);
    pthread_join(a.t, NULL);
    pthread_join(sy.t, NULL);
    cr_assert(atomic_load(&sy.done));
    cr_assert_eq(atomic_load(&gsi_rcu_anon_readers), 0);
}

/* fork() inside an anonymous section while another thread is in one too:
   the child keeps its own share of the count only (the other thread is
   gone), its unlock returns that share, and its grace periods end. */
struct anon_forker {
    struct anon_reader r;
    atomic_int child_status;
};

static void *anon_forker_main(void *arg)
{
    struct anon_forker *f = arg;
    gs_rcu_read_lock(); /* registry lock busy: anonymous */
    atomic_store(&f->r.was_anon, atomic_load(&gsi_rcu_self.snap) == GSI_RCU_SNAP_ANON);
    atomic_store(&f->r.inside, 1);
    while (!atomic_load(&f->r.release))
        sleep_ms(1);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20); /* alarms are not inherited; the handler is */
        int code = atomic_load(&gsi_rcu_anon_readers) == 1 ? 0 : 10;
        gs_rcu_read_unlock();
        if (code == 0 && atomic_load(&gsi_rcu_anon_readers) != 0)
            code = 11;
        gs_synchronize_rcu(); /* hangs (the alarm fails it) if the count leaked */
        gs_rcu_read_lock();   /* the lock is free in the child: registers */
        if (code == 0 && !gsi_rcu_self.registered)
            code = 12;
        gs_rcu_read_unlock();
        _exit(code);
    }
    int st = 0;
    pid_t w;
    do
        w = pid < 0 ? -1 : waitpid(pid, &st, 0);
    while (w < 0 && errno == EINTR);
    atomic_store(&f->child_status, w == pid && WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    gs_rcu_read_unlock();
    atomic_store(&f->r.inside, 0);
    return NULL;
}

Test(rcu, fork_inside_anonymous_section)
{
    fail_after(60);
    gs_synchronize_rcu();
    struct anon_forker f;
    struct anon_reader other;
    atomic_init(&f.r.inside, 0);
    atomic_init(&f.r.release, 0);
    atomic_init(&f.r.was_anon, 0);
    atomic_init(&f.child_status, -2);
    atomic_init(&other.inside, 0);
    atomic_init(&other.release, 0);
    atomic_init(&other.was_anon, 0);
    gsi_rcu_registry_lock();
    cr_assert_eq(pthread_create(&f.r.t, NULL, anon_forker_main, &f), 0);
    cr_assert_eq(pthread_create(&other.t, NULL, anon_reader_main, &other), 0);
    while (!atomic_load(&f.r.inside) || !atomic_load(&other.inside))
        sleep_ms(1);
    gsi_rcu_registry_unlock(); /* fork's prepare handler takes it */
    cr_assert(atomic_load(&f.r.was_anon) && atomic_load(&other.was_anon));
    cr_assert_eq(atomic_load(&gsi_rcu_anon_readers), 2);
    atomic_store(&f.r.release, 1);
    pthread_join(f.r.t, NULL);
    cr_assert_eq(atomic_load(&f.child_status), 0,
                 "child status %d (10: count not 1 after fork, 11: not 0 after unlock, "
                 "12: not registered, 1: hung, -1: no exit)",
                 atomic_load(&f.child_status));
    atomic_store(&other.release, 1);
    pthread_join(other.t, NULL);
    cr_assert_eq(atomic_load(&gsi_rcu_anon_readers), 0);
}

#if !GS_TSAN /* TSan tears its thread state down in the last round of
                     key destructors: the last-round destructor below then
                     crashes inside TSan's runtime, before reaching ours. */
/* The case whose thread only allocated needs graceslab's allocator in this
   program; under ASan, whose malloc must stay the only one (tests/asan/run),
   gs_malloc() is not linked in. */
#if defined(__SANITIZE_ADDRESS__)
#define LATE_ALLOCATOR_CASE 0
#else
#define LATE_ALLOCATOR_CASE 1
#endif
/* A thread whose record the exit destructor unlinked must not link it
   again: glibc runs at most four rounds of key destructors, and a record
   linked in the last one would stay in the registry after the thread's
   memory is gone. Here a user destructor re-arms itself until the last
   round and then enters a read-side section. */
static pthread_key_t late_key;
static atomic_int late_rounds, late_anon;

static void late_destructor(void *arg)
{
    int round = atomic_fetch_add(&late_rounds, 1) + 1;
    if (round < 4) {
        pthread_setspecific(late_key, arg);
        return;
    }
    gs_rcu_read_lock();
    atomic_store(&late_anon, atomic_load(&gsi_rcu_self.snap) == GSI_RCU_SNAP_ANON &&
                                 !gsi_rcu_self.registered);
    gs_rcu_read_unlock();
}

static void *late_main(void *arg)
{
    if (arg) {
        gs_rcu_read_lock(); /* registers: the exit destructor is armed */
        gs_rcu_read_unlock();
    } else {
#if LATE_ALLOCATOR_CASE
        gs_free(gs_malloc(64)); /* only the allocator's exit destructor is armed */
#endif
    }
    pthread_setspecific(late_key, &late_rounds);
    return NULL;
}

/* registered_first: the thread used the read side before (its record's
   destructor unlinks it in round 1); otherwise its first section is the
   last-round one, after the allocator's exit destructor ran. */
static void late_section_case(bool registered_first)
{
    atomic_store(&late_rounds, 0);
    atomic_store(&late_anon, 0);
    gsi_rcu_registry_lock();
    int before = registry_count_locked();
    gsi_rcu_registry_unlock();
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, late_main, registered_first ? &late_rounds : NULL), 0);
    pthread_join(t, NULL);
    cr_assert_eq(atomic_load(&late_rounds), 4);
    cr_assert(atomic_load(&late_anon), "the last-round section was not anonymous (%s)",
              registered_first ? "registered first" : "first section in the last round");
    gsi_rcu_registry_lock();
    int after = registry_count_locked();
    gsi_rcu_registry_unlock();
    cr_assert_eq(after, before, "registry: %d records after the thread exited, %d before",
                 after, before);
    cr_assert_eq(atomic_load(&gsi_rcu_anon_readers), 0);
}

Test(rcu, no_registration_after_thread_exit)
{
    fail_after(60);
    gs_rcu_register_thread();
    cr_assert_eq(pthread_key_create(&late_key, late_destructor), 0);
    late_section_case(true);
    if (LATE_ALLOCATOR_CASE)
        late_section_case(false);
}
#endif

/* fork() holds the registry lock from its prepare handler to its parent
   and child handlers; a handler's read lock on the forking thread must not
   wait for it, in the parent or in the child. */
static pthread_t fork_target;
static atomic_int fork_sig_stop;

static void *fork_signaller(void *arg)
{
    (void)arg;
    while (!atomic_load(&fork_sig_stop)) {
        pthread_kill(fork_target, SIGUSR1);
        usleep(20);
    }
    return NULL;
}

Test(rcu, signals_during_fork)
{
    fail_after(60);
    handle_with_reader(SIGUSR1);
    gs_synchronize_rcu();
    fork_target = pthread_self();
    pthread_t sender;
    cr_assert_eq(pthread_create(&sender, NULL, fork_signaller, NULL), 0);
    int forks = 0, bad = 0;
    for (; forks < 300; forks++) {
        gs_rcu_unregister_thread(); /* so that each handler's lock may register */
        pid_t pid = fork();
        if (pid == 0) {
            alarm(20); /* alarms are not inherited; the handler is */
            /* The child: one thread, a usable engine, handlers included. */
            raise(SIGUSR1);
            gs_rcu_read_lock();
            raise(SIGUSR1); /* nests */
            gs_rcu_read_unlock();
            gs_synchronize_rcu();
            _exit(atomic_load(&gsi_rcu_anon_readers) == 0 ? 0 : 3);
        }
        int st = 0;
        pid_t w;
        do /* the signals interrupt the wait */
            w = pid < 0 ? -1 : waitpid(pid, &st, 0);
        while (w < 0 && errno == EINTR);
        if (w != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad++;
    }
    atomic_store(&fork_sig_stop, 1);
    pthread_join(sender, NULL);
    cr_assert_eq(bad, 0, "%d of %d children failed", bad, forks);
    cr_assert(atomic_load(&sig_hits) > 0);
    cr_assert_eq(atomic_load(&gsi_rcu_anon_readers), 0);
}

/* Storm: reader threads (new ones keep starting, so first locks are in the
   mix) enter and leave read-side sections in a loop while a sender
   interrupts them with a handler that reads too; the updater replaces the
   shared object, waits for a grace period and poisons the old one. Any
   reader, in a handler or not, that sees poison was left unprotected. */
enum { STORM_READERS = 4, STORM_OBJS = 64 };
struct storm_obj {
    atomic_int state; /* 1 live, 2 poisoned */
};
static struct storm_obj storm_objs[STORM_OBJS];
static _Atomic(struct storm_obj *) storm_cur;
static atomic_int storm_stop, storm_bad;
static atomic_long storm_handler_reads;
/* The readers, and last the updater (an unregistered thread whose grace
   periods take the registry lock: a handler there runs anonymously). */
static pthread_t storm_tids[STORM_READERS + 1];
static atomic_int storm_tid_ready[STORM_READERS + 1];

static void storm_read(void)
{
    gs_rcu_read_lock();
    struct storm_obj *o = atomic_load_explicit(&storm_cur, memory_order_acquire);
    for (int i = 0; i < 64; i++)
        if (atomic_load_explicit(&o->state, memory_order_relaxed) != 1)
            atomic_store(&storm_bad, 1);
    gs_rcu_read_unlock();
}

static void storm_handler(int sig)
{
    (void)sig;
    storm_read();
    gs_rcu_read_lock(); /* nested inside whatever the thread was doing */
    storm_read();
    gs_rcu_read_unlock();
    atomic_fetch_add(&storm_handler_reads, 1);
}

static void *storm_reader(void *arg)
{
    long slot = (long)arg;
    for (int gen = 0; !atomic_load(&storm_stop); gen++) {
        /* Each pass is a new, unregistered thread's worth of work: the
           first lock registers under the storm. */
        for (int i = 0; i < 2000 && !atomic_load(&storm_stop); i++)
            storm_read();
        gs_rcu_unregister_thread();
    }
    (void)slot;
    return NULL;
}

static void *storm_sender(void *arg)
{
    (void)arg;
    while (!atomic_load(&storm_stop))
        for (int i = 0; i <= STORM_READERS; i++)
            if (atomic_load(&storm_tid_ready[i]))
                pthread_kill(storm_tids[i], SIGUSR2);
    return NULL;
}

Test(rcu, signal_handlers_read_during_a_storm)
{
    struct sigaction sa = {.sa_handler = storm_handler};
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGUSR2, &sa, NULL), 0);
    fail_after(60);
    for (int i = 0; i < STORM_OBJS; i++)
        atomic_init(&storm_objs[i].state, 0);
    atomic_store(&storm_objs[0].state, 1);
    atomic_store(&storm_cur, &storm_objs[0]);
    for (long i = 0; i < STORM_READERS; i++) {
        cr_assert_eq(pthread_create(&storm_tids[i], NULL, storm_reader, (void *)i), 0);
        atomic_store(&storm_tid_ready[i], 1);
    }
    storm_tids[STORM_READERS] = pthread_self();
    atomic_store(&storm_tid_ready[STORM_READERS], 1);
    pthread_t sender;
    cr_assert_eq(pthread_create(&sender, NULL, storm_sender, NULL), 0);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long updates = 0;
    do {
        struct storm_obj *old = atomic_load(&storm_cur);
        struct storm_obj *next = &storm_objs[(old - storm_objs + 1) % STORM_OBJS];
        atomic_store(&next->state, 1);
        atomic_store_explicit(&storm_cur, next, memory_order_release);
        /* Unregistered, so that a handler's section during the scan (which
           holds the registry lock) is anonymous. */
        gs_rcu_unregister_thread();
        gs_synchronize_rcu();
        atomic_store(&old->state, 2); /* no reader can still hold it */
        updates++;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 < 1500);
    atomic_store(&storm_stop, 1);
    pthread_join(sender, NULL);
    for (int i = 0; i < STORM_READERS; i++)
        pthread_join(storm_tids[i], NULL);
    alarm(0);
    cr_assert_eq(atomic_load(&storm_bad), 0, "a reader saw a poisoned object");
    cr_assert(updates > 10, "only %ld grace periods", updates);
    cr_assert(atomic_load(&storm_handler_reads) > 100, "only %ld handler reads",
              atomic_load(&storm_handler_reads));
}

/* ---- Fork with readers running. ---- */

static atomic_int fork_stop;

static void *fork_reader(void *arg)
{
    long slow = (long)arg;
    while (!atomic_load(&fork_stop)) {
        gs_rcu_read_lock();
        if (slow)
            sleep_ms(5); /* often inside at fork time */
        gs_rcu_read_unlock();
    }
    return NULL;
}

static void *fork_writer(void *arg)
{
    (void)arg;
    static struct gs_rcu_head heads[64];
    int i = 0;
    while (!atomic_load(&fork_stop)) {
        gs_synchronize_rcu();
        gs_call_rcu(&heads[i++ % 64], count_cb);
        if (i % 64 == 0)
            gs_rcu_barrier();
    }
    return NULL;
}

static int child_checks(void)
{
    /* Readers of vanished threads must not block grace periods; the lazy
       thread must come back on demand. */
    alarm(20);
    gs_synchronize_rcu();
    unsigned long c = gs_rcu_get_state();
    gs_synchronize_rcu();
    if (!gs_rcu_poll_state(c))
        return 2;
    static struct gs_rcu_head head;
    int before = atomic_load(&cb_runs);
    gs_call_rcu_hurry(&head, count_cb);
    gs_rcu_barrier();
    if (atomic_load(&cb_runs) < before + 1)
        return 3;
    gs_rcu_read_lock();
    gs_rcu_read_unlock();
    gs_synchronize_rcu();
    return 0;
}

Test(rcu, fork_with_readers_running)
{
    pthread_t t[5];
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, fork_reader, (void *)(i & 1));
    pthread_create(&t[4], NULL, fork_writer, NULL);
    for (int k = 0; k < 20; k++) {
        sleep_ms(7);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0)
            _exit(child_checks());
        int st;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        cr_assert(WIFEXITED(st), "fork child died (status %d)", st);
        cr_assert_eq(WEXITSTATUS(st), 0, "fork child check %d failed", WEXITSTATUS(st));
    }
    atomic_store(&fork_stop, 1);
    for (int i = 0; i < 5; i++)
        pthread_join(t[i], NULL);
    gs_rcu_barrier();
}
