/*
 * C++'s operator new and delete, replaced as the standard allows (and as
 * jemalloc, tcmalloc and mimalloc do), so that a C++ program's new and delete run
 * malloc's and free's fast paths in one call. Without them, new is
 * libstdc++'s operator new, which calls malloc through its PLT and tests
 * the result, and delete jumps twice on its way to free: 73 instructions
 * per new+delete of 64 bytes, 54 with these (callgrind, bench/pair64_new;
 * docs/design.md, section 4).
 *
 * Replaced: the throwing forms of new and new[], plain and aligned, and
 * every delete but the nothrow ones. libstdc++'s and libc++'s nothrow new
 * call the throwing ::operator new inside a try block and return NULL from
 * its catch, and their nothrow delete calls ::operator delete: they reach
 * these and keep their meaning, which C could not give them (it cannot
 * catch).
 *
 * Failure is the standard's: while a new_handler is installed, call it and
 * try again; with none, throw std::bad_alloc. Both through the C++
 * runtime: std::get_new_handler and std::__throw_bad_alloc, which
 * libstdc++ and libc++ (with libc++abi) export under the same names. Weak
 * references, bound when graceslab is loaded if the program brought a C++
 * runtime; a C program that dlopens C++ code later has them looked up
 * (runtime_symbol), on this failure path only. A handler that throws, and bad_alloc itself,
 * unwind through the functions below: C code, but compiled with unwind
 * tables (the x86_64 default), and with nothing to clean up.
 *
 * Sized delete: the size is not needed (the slab knows its class) and not
 * checked. Bad pointers abort as free's do, naming operator delete.
 */
#include "alloc/internal.h"

#include <dlfcn.h>

typedef void (*gs_new_handler)(void);
extern gs_new_handler cxx_get_new_handler(void)
    __asm__("_ZSt15get_new_handlerv") __attribute__((weak));
extern _Noreturn void cxx_throw_bad_alloc(void)
    __asm__("_ZSt17__throw_bad_allocv") __attribute__((weak));

/* A C++ runtime's function, for a program that loaded the runtime after
   graceslab. Often not in the global scope: a plugin dlopened with
   RTLD_LOCAL (Python's default for extension modules) keeps the runtime it
   brings to itself, so it is also asked for by name, without loading
   anything (RTLD_NOLOAD). */
static void *runtime_symbol(const char *name)
{
    static const char *const runtimes[] = {"libstdc++.so.6", "libc++abi.so.1", "libc++.so.1"};
    void *f = dlsym(RTLD_DEFAULT, name);
    for (size_t i = 0; !f && i < sizeof runtimes / sizeof runtimes[0]; i++) {
        void *h = dlopen(runtimes[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            f = dlsym(h, name);
            dlclose(h); /* only the reference RTLD_NOLOAD added */
        }
    }
    return f;
}

static _Noreturn void throw_bad_alloc(void)
{
    void (*thrower)(void) = cxx_throw_bad_alloc;
    if (!thrower)
        *(void **)&thrower = runtime_symbol("_ZSt17__throw_bad_allocv");
    if (!thrower)
        gsi_fatal_msg("operator new", "out of memory, and no C++ runtime to throw std::bad_alloc");
    thrower();
    __builtin_unreachable();
}

static gs_new_handler new_handler(void)
{
    gs_new_handler (*get)(void) = cxx_get_new_handler;
    if (!get)
        *(void **)&get = runtime_symbol("_ZSt15get_new_handlerv");
    return get ? get() : NULL;
}

/* new could not allocate size bytes (aligned to align, if not 0). */
static GS_NOINLINE void *new_failed(size_t size, size_t align)
{
    for (;;) {
        gs_new_handler handler = new_handler();
        if (!handler)
            throw_bad_alloc();
        handler();
        void *p = align ? gsi_malloc_aligned(size, align) : gsi_malloc_fast(size);
        if (p)
            return p;
    }
}

/* malloc's slow paths, then new's failure handling. */
static GS_NOINLINE void *new_small_slow(size_t size)
{
    void *p = gsi_malloc_small_slow(size);
    return GS_LIKELY(p != NULL) ? p : new_failed(size, 0);
}

static GS_NOINLINE void *new_large(size_t size)
{
    void *p = gsi_malloc_large(size);
    return GS_LIKELY(p != NULL) ? p : new_failed(size, 0);
}

static void *gsi_cxx_new(size_t size)
{
    return gsi_malloc_fast_or(size, new_small_slow, new_large);
}

static void *gsi_cxx_new_aligned(size_t size, size_t align)
{
    /* Not a power of two: undefined in the standard; libstdc++ throws. */
    if (GS_UNLIKELY(align == 0 || (align & (align - 1))))
        throw_bad_alloc();
    void *p = gsi_malloc_aligned(size, align);
    if (GS_LIKELY(p != NULL))
        return p;
    return new_failed(size, align);
}

static void gsi_cxx_delete(void *p)
{
    gsi_free_fast(p, "operator delete");
}

/* The sized and aligned forms take arguments delete does not need; each is
   a function of its own (not an alias of one with fewer parameters, which
   gcc rightly calls a type mismatch). */
static void gsi_cxx_delete_sized(void *p, size_t size)
{
    (void)size;
    gsi_free_fast(p, "operator delete");
}

static void gsi_cxx_delete_aligned(void *p, size_t align)
{
    (void)align;
    gsi_free_fast(p, "operator delete");
}

static void gsi_cxx_delete_sized_aligned(void *p, size_t size, size_t align)
{
    (void)size;
    (void)align;
    gsi_free_fast(p, "operator delete");
}

/* The Itanium C++ ABI's names: new(size_t), new[](size_t), the same with
   std::align_val_t; delete and delete[] of (void *), (void *, size_t),
   (void *, std::align_val_t) and (void *, size_t, std::align_val_t). */
#define GS_CXX(name, target) __asm__(name) __attribute__((alias(#target), visibility("default")))
void *gs_cxx_new(size_t) GS_CXX("_Znwm", gsi_cxx_new);
void *gs_cxx_new_array(size_t) GS_CXX("_Znam", gsi_cxx_new);
void *gs_cxx_new_aligned(size_t, size_t) GS_CXX("_ZnwmSt11align_val_t", gsi_cxx_new_aligned);
void *gs_cxx_new_array_aligned(size_t, size_t)
    GS_CXX("_ZnamSt11align_val_t", gsi_cxx_new_aligned);
void gs_cxx_delete(void *) GS_CXX("_ZdlPv", gsi_cxx_delete);
void gs_cxx_delete_array(void *) GS_CXX("_ZdaPv", gsi_cxx_delete);
void gs_cxx_delete_sized(void *, size_t) GS_CXX("_ZdlPvm", gsi_cxx_delete_sized);
void gs_cxx_delete_array_sized(void *, size_t) GS_CXX("_ZdaPvm", gsi_cxx_delete_sized);
void gs_cxx_delete_aligned(void *, size_t) GS_CXX("_ZdlPvSt11align_val_t", gsi_cxx_delete_aligned);
void gs_cxx_delete_array_aligned(void *, size_t)
    GS_CXX("_ZdaPvSt11align_val_t", gsi_cxx_delete_aligned);
void gs_cxx_delete_sized_aligned(void *, size_t, size_t)
    GS_CXX("_ZdlPvmSt11align_val_t", gsi_cxx_delete_sized_aligned);
void gs_cxx_delete_array_sized_aligned(void *, size_t, size_t)
    GS_CXX("_ZdaPvmSt11align_val_t", gsi_cxx_delete_sized_aligned);
