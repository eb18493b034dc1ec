/*
 * The purge thread: gives back, GRACESLAB_PURGE_DELAY_MS after they emptied,
 * the empty slabs beyond GRACESLAB_EMPTY_CACHE_MB that segment.c would
 * otherwise decommit at once. A program that frees a large heap and
 * allocates it again within the delay then reuses committed memory instead
 * of faulting every page in again (measured on bench/random with every
 * size above 1 KiB: 30 times the throughput), and one that frees it and
 * makes no further call still gets its memory back within two delays.
 *
 * The thread exists only while such memory waits: the retirement that
 * takes the empty slabs past the cap starts it; it sleeps one delay, purges
 * what has been empty that long, and exits once what is left fits in the
 * cap. An idle process has no purge thread: no wakeups, and no extra
 * thread in a program that needs to be single-threaded (unshare(2) of a
 * user namespace, for one) — unless it calls that within moments of freeing
 * more than the cap.
 *
 * Without the thread (GRACESLAB_PURGE_THREAD=0, or pthread_create fails)
 * memory beyond the cap goes back at once, as it did before the thread.
 *
 * Locking: purge_lock protects `running`. Lock order: segment_lock ->
 * purge_lock (segment.c arms with its lock held); the thread takes them
 * one at a time.
 */
#include "alloc/internal.h"

#include <errno.h>
#include <sys/prctl.h>
#include <time.h>

static pthread_mutex_t purge_lock = PTHREAD_MUTEX_INITIALIZER;
/* A thread runs, or is being created, and will look at the empty slabs
   again before it exits. Set before the thread is created, so that it can
   never be set after that thread has exited. */
static bool running;
/* Passes the thread made, ever (tests). */
static _Atomic uint64_t passes;

static void sleep_ns(uint64_t ns)
{
    struct timespec t = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &t, &t) == EINTR) {
    }
}

static void *purge_main(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "gs-purge", 0, 0, 0);
    for (;;) {
        /* Everything that pushed the slabs past the cap before this pass
           started is at least one delay old when it runs. */
        sleep_ns((uint64_t)gsi_option(GSI_OPT_PURGE_DELAY_MS) * 1000000u);
        gsi_segments_purge(false);
        atomic_fetch_add_explicit(&passes, 1, memory_order_relaxed);
        pthread_mutex_lock(&purge_lock);
        /* A retirement that takes the slabs past the cap after this lock
           finds no thread and starts one; one that did before it has
           updated the count under segment_lock and then armed under
           purge_lock, so the count read here includes it. */
        if (!gsi_segments_over_cap()) {
            running = false;
            pthread_mutex_unlock(&purge_lock);
            return NULL;
        }
        pthread_mutex_unlock(&purge_lock);
    }
}

bool gsi_purge_arm(bool *start)
{
    *start = false;
    if (!gsi_option(GSI_OPT_PURGE_THREAD))
        return false;
    pthread_mutex_lock(&purge_lock);
    if (!running)
        running = *start = true;
    pthread_mutex_unlock(&purge_lock);
    return true;
}

void gsi_purge_start(void)
{
    if (gsi_thread_spawn(purge_main) != 0) {
        pthread_mutex_lock(&purge_lock);
        running = false;
        pthread_mutex_unlock(&purge_lock);
        /* After that store: whatever was armed meanwhile is in the slabs
           this purge sees. What the cap would have done, and the rest. */
        gsi_segments_purge(true);
    }
}

void gsi_purge_atfork_child(void)
{
    /* The parent's thread, if any, is not in the child. */
    pthread_mutex_init(&purge_lock, NULL);
    running = false;
}

bool gsi_purge_thread_exists(void)
{
    pthread_mutex_lock(&purge_lock);
    bool exists = running;
    pthread_mutex_unlock(&purge_lock);
    return exists;
}

uint64_t gsi_purge_passes(void)
{
    return atomic_load_explicit(&passes, memory_order_relaxed);
}
