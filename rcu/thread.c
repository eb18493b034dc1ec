/*
 * Threads and the reader registry: one reader record per thread (in
 * initial-exec TLS), linked into a mutex-protected list on first use,
 * unlinked when the thread exits (a pthread key destructor) or calls
 * gs_rcu_unregister_thread(). Engine initialisation (read-side mode,
 * membarrier registration, the key, the fork handlers) happens once, from
 * the first registration or deferral.
 *
 * Fork: the prepare handler takes the registry lock, so the child inherits
 * a well-formed list; the child handler keeps only its own record (the
 * other threads are gone, so their readers must not hold grace periods
 * open), resets the GP driver's mutex (gp.c) and forgets the lazy thread
 * (callback.c), which is recreated on the next deferral.
 */
#include "rcu/engine.h"
#include "rcu/internal.h"
#include "graceslab.h"

#include <linux/membarrier.h>
#include <signal.h>

/* Every thread's record starts with the call bit set (a TLS initialiser,
   copied into each new thread's block): the inlined read side of a thread
   that has not registered yet must call the library, which registers it. */
__thread struct gsi_rcu_reader gsi_rcu_self __attribute__((tls_model("initial-exec"))) = {
    .nested = GSI_RCU_NESTED_CALL,
};
bool gsi_rcu_fences;

/* The record as the inlined read side sees it: the same TLS object under
   a public name and the public prefix type (graceslab.h). */
extern __thread struct gsi_rcu_reader_view gsi_rcu_self_view_v3
    __attribute__((alias("gsi_rcu_self"))) GS_INLINE_ABI;
#define SAME_FIELD(f)                                                            \
    (offsetof(struct gsi_rcu_reader, f) == offsetof(struct gsi_rcu_reader_view, f) && \
     sizeof(((struct gsi_rcu_reader *)0)->f) == sizeof(((struct gsi_rcu_reader_view *)0)->f))
_Static_assert(SAME_FIELD(snap) && SAME_FIELD(nested),
               "struct gsi_rcu_reader_view (graceslab.h) is a prefix of gsi_rcu_reader");

/* Registry lock: protects registry_head and every record's next/prev and
   registered fields (writes). Lock order: GP mutex (gp.c) -> registry lock.
   Held only for list walks and link/unlink, never across a sleep. */
static pthread_mutex_t registry_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct gsi_rcu_reader *registry_head;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static atomic_bool init_done; /* set last by init_once_fn() */
static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT; /* make_exit_key() */
static bool exit_key_made;

/* Signals. A signal handler may enter a read-side critical section, and
   on a thread that is not registered that links its record. Unregistration,
   the one-time init and the fork child handler therefore run with every
   signal blocked: between gs_rcu_unregister_thread()'s unlink and its
   disarming of the exit destructor, a handler would leave a linked record
   without a destructor; inside pthread_once() it would wait for itself; in
   the fork child, between the reset of the list and the re-link, it would
   link the record twice. Registration itself needs no blocking: a handler
   that finds the registry lock taken runs an anonymous section, and the
   record is linked once, under the lock. gs_rcu_register_thread() and
   gs_rcu_unregister_thread() wait for the registry lock: they are not for
   signal handlers. */
void gsi_rcu_registry_lock(void)
{
    pthread_mutex_lock(&registry_mutex);
}

void gsi_rcu_registry_unlock(void)
{
    pthread_mutex_unlock(&registry_mutex);
}

struct gsi_rcu_reader *gsi_rcu_registry_first_locked(void)
{
    return registry_head;
}

static void link_locked(struct gsi_rcu_reader *r)
{
    r->prev = NULL;
    r->next = registry_head;
    if (registry_head)
        registry_head->prev = r;
    registry_head = r;
    r->registered = true;
    gsi_rcu_reader_set_call(r, gsi_rcu_fences);
}

static void unlink_locked(struct gsi_rcu_reader *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        registry_head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->next = r->prev = NULL;
    r->registered = false;
    gsi_rcu_reader_set_call(r, true);
}

/* membarrier(2) with MEMBARRIER_CMD_PRIVATE_EXPEDITED usable? Registers the
   process for it (needed once per process, and again in a fork child). */
static bool membarrier_register(void)
{
    long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED))
        return false;
    return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

/* Key destructor: runs on the exiting thread with r == &gsi_rcu_self. */
static void thread_exit(void *arg)
{
    struct gsi_rcu_reader *r = arg;
    if (GS_UNLIKELY(atomic_load_explicit(&r->snap, memory_order_relaxed) != 0))
        gsi_fatal_msg("pthread_exit",
                      "thread exited inside an RCU read-side critical section");
    pthread_mutex_lock(&registry_mutex);
    /* Before the unlink: a read lock that finds the record unlinked (a
       signal handler, a later destructor) then runs anonymous sections
       instead of linking it again, which nothing would undo. */
    r->exited = true;
    if (r->registered)
        unlink_locked(r);
    pthread_mutex_unlock(&registry_mutex);
}

/* Membarrier registration is per mm: a fork child redoes it (if the engine
   was set up: the handlers exist from load time on). Only one thread
   exists in the child, so falling back to fences here cannot race with a
   reader. All a child of a process without threads needs; part of
   gsi_rcu_atfork_child for the others. */
void gsi_rcu_atfork_child_alone(void)
{
    if (atomic_load_explicit(&init_done, memory_order_relaxed) && !gsi_rcu_fences &&
        !membarrier_register()) {
        gsi_rcu_fences = true;
        gsi_rcu_reader_set_call(&gsi_rcu_self, true); /* the inlined read side follows (see below) */
    }
}

/* Fork handlers: registered by the allocator, in one triple with its own
   (gsi_fork_handlers_register in alloc/heap.c: the order of the two sets
   matters). */
void gsi_rcu_atfork_prepare(void)
{
    /* The lazy thread takes cb_take_mutex alone, never with the registry
       lock: no order between the two. */
    gsi_rcu_cb_atfork_prepare();
    pthread_mutex_lock(&registry_mutex);
}

void gsi_rcu_atfork_parent(void)
{
    pthread_mutex_unlock(&registry_mutex);
    gsi_rcu_cb_atfork_parent();
}

void gsi_rcu_atfork_child(void)
{
    struct gsi_rcu_reader *self = &gsi_rcu_self;
    /* A handler's first lock between the reset of the list and the re-link
       below would link the record twice. */
    sigset_t saved;
    gsi_rcu_signals_block(&saved);
    /* Only this thread survives: drop every other record. */
    /* Locked by this thread in atfork_prepare (the handlers exist from
       load time on, so every fork that runs this ran that): unlock, which
       also keeps ThreadSanitizer's view of the mutex right. */
    pthread_mutex_unlock(&registry_mutex);
    registry_head = NULL;
    if (self->registered)
        link_locked(self);
    gsi_rcu_atfork_child_alone();
    /* The other threads' anonymous sections are gone with them; this
       thread holds one share if it forked inside an anonymous section
       (anon_lock/anon_unlock run with signals blocked, so a handler that
       forks never splits one). Such a section may have a linked record (a
       handler registered the thread just before it began): its unlock must
       still reach anon_unlock(), so the inlined side stays off. */
    bool anon = atomic_load_explicit(&self->snap, memory_order_relaxed) == GSI_RCU_SNAP_ANON;
    atomic_store_explicit(&gsi_rcu_anon_readers, anon, memory_order_relaxed);
    /* A wait the section's unlock owed was for the parent's memory. */
    self->owed = (struct gsi_rcu_owed_wait){0, 0, false};
    gsi_rcu_reader_set_call(self, !self->registered || gsi_rcu_fences || anon); /* for the inlined read side */
    gsi_gp_atfork_child();
    gsi_rcu_cb_atfork_child();
    gsi_rcu_signals_restore(&saved);
}

/* Run once (exit_key_once): from the constructor below or from
   init_once_fn(), whichever comes first; pthread_once orders the key and
   the flag for both. */
static void make_exit_key(void)
{
    exit_key_made = pthread_key_create(&exit_key, thread_exit) == 0;
}

static void init_once_fn(void)
{
    /* The fork handlers (the allocator registers them, with the engine's,
       at load time or at the first allocation, whichever comes first; this
       covers a program that uses only the engine and a copy loaded with
       dlopen). */
    gsi_heap_init_once();
    /* ThreadSanitizer does not see the ordering membarrier(2) gives the
       compiler-barrier read side, so TSan builds always use the fence read
       side (chosen here, once; no #if in the read side itself). */
    gsi_rcu_fences = GS_TSAN || gsi_option(GSI_OPT_RCU_FENCES) != 0 ||
                     !membarrier_register();
    pthread_once(&exit_key_once, make_exit_key);
    if (!exit_key_made)
        gsi_fatal_msg("gs_rcu_register_thread", "pthread_key_create failed");
    /* Release: pairs with the acquire load in gsi_rcu_init(); a thread that
       sees the flag sees the mode and the key. */
    atomic_store_explicit(&init_done, true, memory_order_release);
}

void gsi_rcu_init(void)
{
    /* Acquire: pairs with the release store at the end of init_once_fn(). */
    if (GS_LIKELY(atomic_load_explicit(&init_done, memory_order_acquire)))
        return;
    sigset_t saved;
    gsi_rcu_signals_block(&saved);
    pthread_once(&init_once, init_once_fn);
    gsi_rcu_signals_restore(&saved);
}

/* The exit key is made at load time, not at the first use: a thread's
   first read lock arms it with pthread_setspecific(), which allocates
   (calloc, for the thread's second-level key block) when the key is the
   33rd or later. Made at the first use, the key came after every key the
   program had made by then, and a first read lock in a signal handler
   re-entered the malloc it had interrupted (double frees, overwritten
   blocks: a stress helper's program with 40 keys). At load, only keys that
   constructors run earlier made come before it (those of libraries loaded
   before graceslab; with the static archive, the program's own too). The
   rest of the initialisation stays at the first use (no membarrier(2)
   registration in programs that never use the engine). One pthread_once
   for both callers: an engine used from an earlier constructor makes the
   key there, and this one then finds it made. */
__attribute__((constructor)) static void make_exit_key_at_load(void)
{
    pthread_once(&exit_key_once, make_exit_key);
}

bool gsi_rcu_register_slow(bool wait)
{
    struct gsi_rcu_reader *r = &gsi_rcu_self;
    /* First, also for the anonymous sections a false return leads to: the
       fork handlers must exist to rebuild the count in a child. */
    gsi_rcu_init();
    /* An exiting thread stays out (`exited`: set by thread_exit() or by
       the allocator's exit destructor). And inside an anonymous section
       (gs_rcu_register_thread() from a nested signal handler) a linked
       record would make the section's unlink forget the count. */
    if (r->exited || atomic_load_explicit(&r->snap, memory_order_relaxed) != 0)
        return false;
    /* The first read lock does not wait: the registry lock may be held by
       the code a signal handler interrupted, on this very thread. */
    if (wait) {
        pthread_mutex_lock(&registry_mutex);
    } else if (pthread_mutex_trylock(&registry_mutex) != 0) {
        /* The section will be anonymous. Arm thread_exit() all the same,
           so that exiting inside it aborts with the usual line instead of
           leaking its share of the count (every later grace period would
           wait for it). */
        pthread_setspecific(exit_key, r);
        return false;
    }
    /* Checked under the lock: a signal handler may have linked the record
       since the caller looked. */
    bool linked = !r->registered;
    if (linked)
        link_locked(r);
    pthread_mutex_unlock(&registry_mutex);
    /* Arms thread_exit(). Keys below PTHREAD_KEY_2NDLEVEL_SIZE (32) use the
       thread descriptor's inline array: no allocation (the key is made at
       load time, see make_exit_key_at_load). A handler that runs
       before this sees the record registered and does not arm it. */
    if (linked)
        pthread_setspecific(exit_key, r);
    return true;
}

void gsi_rcu_thread_exiting(void)
{
    struct gsi_rcu_reader *r = &gsi_rcu_self;
    /* The allocator's destructor may run before the RCU one, or instead of
       it (an anonymous section begun before any registration was tried
       would not have armed it): same check as thread_exit(). */
    if (GS_UNLIKELY(atomic_load_explicit(&r->snap, memory_order_relaxed) != 0))
        gsi_fatal_msg("pthread_exit",
                      "thread exited inside an RCU read-side critical section");
    r->exited = true;
}

GS_EXPORT void gs_rcu_register_thread(void)
{
    if (!gsi_rcu_self.registered)
        gsi_rcu_register_slow(true);
}

GS_EXPORT void gs_rcu_unregister_thread(void)
{
    struct gsi_rcu_reader *r = &gsi_rcu_self;
    if (GS_UNLIKELY(atomic_load_explicit(&r->snap, memory_order_relaxed) != 0))
        gsi_fatal_msg("gs_rcu_unregister_thread",
                      "called inside an RCU read-side critical section");
    if (!r->registered)
        return;
    sigset_t saved;
    gsi_rcu_signals_block(&saved);
    pthread_mutex_lock(&registry_mutex);
    unlink_locked(r);
    pthread_mutex_unlock(&registry_mutex);
    pthread_setspecific(exit_key, NULL);
    gsi_rcu_signals_restore(&saved);
}
