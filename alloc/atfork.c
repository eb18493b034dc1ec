/*
 * Fork handler order: graceslab's handlers are registered before anyone
 * else's.
 *
 * glibc runs prepare handlers in the reverse order of registration and
 * parent/child handlers in that order, and takes its own malloc's locks
 * after every prepare handler and releases them before every parent/child
 * handler, so that those handlers may allocate. graceslab's locks are taken
 * by a handler (alloc/heap.c, fork_prepare); to be taken after every other
 * prepare handler and released before every other parent/child handler,
 * it must be the first one registered. Left to its load-time constructor,
 * it was not when a library registered handlers from its own constructor,
 * which ran first: a prepare or child handler that allocated then waited
 * for graceslab's locks in the forking thread (a hang at the first fork),
 * and a library that registered more than 48 handlers before the process's
 * first malloc made glibc allocate while it held its handler-list lock, so
 * graceslab's initialisation, run by that malloc, waited for the same lock
 * to register its own (a hang at start-up). Both found by a helper working
 * through glibc's malloc tests.
 *
 * So graceslab defines __register_atfork, the function behind every
 * pthread_atfork (libc_nonshared.a's pthread_atfork calls it with the
 * caller's DSO handle): it initialises the allocator, which registers
 * graceslab's handlers first, then passes the registration on to libc's.
 * Weak, so that a fully static program (libc.a defines it too) keeps
 * libc's: there the program's own constructors run after libc's, and
 * graceslab's order is what it was. A program linked with libgraceslab.a
 * and the shared libc interposes only its own registrations.
 */
#include "alloc/common.h"
#include "rcu/internal.h"

#include <dlfcn.h>
#include <stdatomic.h>

/* Not in sanitizer builds: their runtimes register fork handlers while
   they start, before instrumented code can run (ThreadSanitizer crashed
   in this function, called from its own initialisation). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define GS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define GS_SANITIZED 1
#endif
#endif

#ifndef GS_SANITIZED

typedef int register_atfork_fn(void (*)(void), void (*)(void), void (*)(void), void *);

/* libc's __register_atfork: the next definition after graceslab's. Looked
   up on the first registration; racing first calls store the same value
   (relaxed: it points to libc's code, published by the dynamic linker). */
static register_atfork_fn *_Atomic libc_register_atfork;

GS_EXPORT __attribute__((weak)) int __register_atfork(void (*prepare)(void), void (*parent)(void),
                                                      void (*child)(void), void *dso_handle)
{
    /* First graceslab's own registration (its pthread_atfork comes back
       here, inside the initialisation, which then returns at once). */
    gsi_heap_init_once();
    register_atfork_fn *real = atomic_load_explicit(&libc_register_atfork, memory_order_relaxed);
    if (GS_UNLIKELY(!real)) {
        *(void **)&real = dlsym(RTLD_NEXT, "__register_atfork");
        if (!real)
            gsi_fatal_msg("pthread_atfork", "libc's __register_atfork not found");
        atomic_store_explicit(&libc_register_atfork, real, memory_order_relaxed);
    }
    return real(prepare, parent, child, dso_handle);
}

#endif /* !GS_SANITIZED */
