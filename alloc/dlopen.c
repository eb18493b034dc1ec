/*
 * dlopen without RTLD_DEEPBIND.
 *
 * A library opened with RTLD_DEEPBIND looks its symbols up in itself and
 * its own dependencies -- libc among them -- before the global scope. Its
 * malloc and free are then glibc's while the rest of the process uses
 * graceslab's, and the first block to cross between the two crashes inside
 * glibc's free. PHP opens every extension this way (pdo.so frees a block
 * the PHP binary allocated while `php -r 'echo 1;'` starts up); jemalloc,
 * tcmalloc and mimalloc crash the same way there. So graceslab's dlopen
 * clears the flag, and the library binds malloc, like every other symbol it
 * does not define itself, through the global scope -- what PHP itself does
 * when built with AddressSanitizer and, since 8.5, wherever dlmopen exists.
 * The cost: a library that relied on RTLD_DEEPBIND to prefer its own copy
 * of a symbol that the program also defines gets the program's.
 * GRACESLAB_DEEPBIND=1 passes the flag through unchanged.
 *
 * The call into libc's dlopen must be a tail call. glibc takes its own
 * return address as the caller's identity: a file name without a slash is
 * searched along the caller's RUNPATH, $ORIGIN means the caller's
 * directory, and the library joins the caller's namespace. A jump leaves
 * the program's return address in place; a call would make graceslab the
 * caller. tests/unit/test_dlopen.c opens its plugin both ways.
 */
#include "alloc/common.h"

#include <dlfcn.h>
#include <stdatomic.h>

/* libc's dlopen: the next definition after graceslab's in the lookup
   order. Looked up on the first call, outside any allocator path, so
   dlsym's own allocations are ordinary mallocs. Racing first calls store
   the same value; a relaxed atomic suffices (the function it points to is
   libc's code, published by the dynamic linker before any call). */
static void *(*_Atomic libc_dlopen)(const char *, int);

/* Guaranteed tail call in every build type: clang's musttail; gcc (no
   musttail before 15) optimises this one function for sibling calls. */
#if defined(__clang__)
#define GS_TAIL_CALL __attribute__((musttail))
#define GS_TAIL_CALLER
#else
#define GS_TAIL_CALL
#define GS_TAIL_CALLER __attribute__((optimize("O2", "optimize-sibling-calls")))
#endif

/* libc.a's dlopen, of which `dlopen` is a weak alias there (glibc 2.34
   on). A fully static program has no RTLD_NEXT to look it up with, and
   graceslab's dlopen takes its name; this reaches the function, which a
   static program that calls dlopen has anyway (libc.a's own dlopen
   machinery refers to it). Weak: where libc is a shared library it does
   not export the name, and this stays null. */
extern void *___dlopen(const char *, int) __attribute__((weak));

static GS_NOINLINE void *(*find_libc_dlopen(void))(const char *, int)
{
    void *(*f)(const char *, int);
    *(void **)&f = dlsym(RTLD_NEXT, "dlopen");
    if (!f)
        f = ___dlopen;
    if (!f)
        gsi_fatal_msg("dlopen", "libc's dlopen not found");
    atomic_store_explicit(&libc_dlopen, f, memory_order_relaxed);
    return f;
}

GS_EXPORT GS_TAIL_CALLER void *dlopen(const char *file, int mode)
{
    void *(*real)(const char *, int) = atomic_load_explicit(&libc_dlopen, memory_order_relaxed);
    if (GS_UNLIKELY(!real))
        real = find_libc_dlopen();
    if ((mode & RTLD_DEEPBIND) && !gsi_option(GSI_OPT_DEEPBIND))
        mode &= ~RTLD_DEEPBIND;
    GS_TAIL_CALL return real(file, mode);
}
