/*
 * C++'s operator new and delete are graceslab's (alloc/cxx.c). The C++ code
 * is a plugin this program dlopens (cxx_new_plugin.cpp); its probes turn
 * exceptions and handlers into return values. Built twice: linked with
 * libstdc++ (GS_RUNTIME_AT_START=1: graceslab finds the C++ runtime when
 * it is loaded) and without it (0: the plugin brings the runtime after
 * graceslab, as when a C program loads C++ code). Run with
 * GRACESLAB_OS_FAIL_AFTER_MB=256, so that a new_handler can free memory
 * for new to retry into.
 */
#include <criterion/criterion.h>

#include <graceslab.h>
#include "../common.h"

#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <string.h>

#define PLUGIN "libgs_cxx_new_plugin.so"
#define HUGE ((size_t)1 << 62)

static void *plugin(void)
{
    static void *h;
    if (!h) {
        h = dlopen(PLUGIN, RTLD_NOW | RTLD_LOCAL);
        cr_assert_not_null(h, "dlopen(%s): %s", PLUGIN, dlerror());
    }
    return h;
}

static void *sym(const char *name)
{
    void *f = dlsym(plugin(), name);
    cr_assert_not_null(f, "dlsym(%s): %s", name, dlerror());
    return f;
}

/* The file that defines the code at address f. */
static const char *defined_in(void *f)
{
    Dl_info info;
    cr_assert(dladdr(f, &info) && info.dli_fname, "dladdr(%p) failed", f);
    return info.dli_fname;
}

Test(cxx_new, runtime_is_loaded_as_the_build_says)
{
    void *thrower = dlsym(RTLD_DEFAULT, "_ZSt17__throw_bad_allocv");
    cr_assert_eq(thrower != NULL, GS_RUNTIME_AT_START,
                 "C++ runtime %s before the plugin", thrower ? "loaded" : "absent");
    /* The plugin is opened with RTLD_LOCAL: a runtime it brings stays out
       of the global scope, and graceslab must find it by name. */
    plugin();
    cr_assert_eq(dlsym(RTLD_DEFAULT, "_ZSt17__throw_bad_allocv") != NULL, GS_RUNTIME_AT_START);
}

Test(cxx_new, every_replaced_operator_is_graceslabs)
{
    static const char *const names[] = {
        "_Znwm", "_Znam", "_ZnwmSt11align_val_t", "_ZnamSt11align_val_t",
        "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm", "_ZdlPvSt11align_val_t",
        "_ZdaPvSt11align_val_t", "_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t",
    };
    plugin();
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *f = dlsym(RTLD_DEFAULT, names[i]);
        cr_assert_not_null(f, "%s not found", names[i]);
        cr_assert(strstr(defined_in(f), "libgraceslab"), "%s is %s's", names[i], defined_in(f));
    }
    /* And what C++ code calls is that one (the first definition in the
       lookup order, ahead of the runtime's own). */
    void *(*new_address)(void) = (void *(*)(void))sym("plugin_new_address");
    void *(*delete_address)(void) = (void *(*)(void))sym("plugin_sized_delete_address");
    cr_assert(strstr(defined_in(new_address()), "libgraceslab"), "%s", defined_in(new_address()));
    cr_assert(strstr(defined_in(delete_address()), "libgraceslab"), "%s",
              defined_in(delete_address()));
}

Test(cxx_new, new_and_delete_take_and_give_graceslab_blocks)
{
    void *(*new_bytes)(size_t) = (void *(*)(size_t))sym("plugin_new");
    void (*delete_bytes)(void *) = (void (*)(void *))sym("plugin_delete");
    void (*sized_delete)(void *, size_t) = (void (*)(void *, size_t))sym("plugin_sized_delete");
    struct gs_stats before, after;
    char *p = new_bytes(100);
    cr_assert_eq(gs_usable_size(p), 112); /* aborts if p is not graceslab's */
    memset(p, 0x5a, 100);
    gs_stats_get(&before);
    delete_bytes(p);
    gs_stats_get(&after);
    cr_assert_eq(after.allocated_bytes, before.allocated_bytes - 112);
    char *q = new_bytes(100); /* the block freed just now, from the thread's slab */
    cr_assert_eq(q, p);
    sized_delete(q, 100);

    void *(*new_aligned)(void) = (void *(*)(void))sym("plugin_new_aligned_block");
    void (*delete_aligned)(void *) = (void (*)(void *))sym("plugin_delete_aligned_block");
    void *a = new_aligned();
    cr_assert_eq((uintptr_t)a % 256, 0, "%p", a);
    cr_assert_geq(gs_usable_size(a), 300);
    delete_aligned(a);
}

Test(cxx_new, failed_new_throws_bad_alloc)
{
    int (*throws)(size_t, size_t) = (int (*)(size_t, size_t))sym("plugin_new_throws_bad_alloc");
    cr_assert_eq(throws(100, 0), 0);
    cr_assert_eq(throws(100, 4096), 0);
    cr_assert_eq(throws(HUGE, 0), 1);
    cr_assert_eq(throws(SIZE_MAX, 0), 1);
    cr_assert_eq(throws(HUGE, 64), 1);
    cr_assert_eq(throws(100, 48), 1); /* not a power of two, as libstdc++ */
}

Test(cxx_new, nothrow_new_returns_null)
{
    void *(*nothrow)(size_t, size_t) = (void *(*)(size_t, size_t))sym("plugin_nothrow_new");
    void (*sized_delete)(void *, size_t) = (void (*)(void *, size_t))sym("plugin_sized_delete");
    cr_assert_null(nothrow(HUGE, 0));
    cr_assert_null(nothrow(HUGE, 128));
    void *p = nothrow(100, 0);
    cr_assert_not_null(p);
    cr_assert_eq(gs_usable_size(p), 112);
    sized_delete(p, 100);
}

Test(cxx_new, handler_runs_until_it_gives_up)
{
    int (*calls)(size_t, int) = (int (*)(size_t, int))sym("plugin_handler_calls_until_bad_alloc");
    cr_assert_eq(calls(HUGE, 1), 1);
    cr_assert_eq(calls(HUGE, 3), 3);
}

Test(cxx_new, handler_exception_reaches_the_caller)
{
    int (*reaches)(size_t) = (int (*)(size_t))sym("plugin_handler_exception_reaches_caller");
    cr_assert_eq(reaches(HUGE), 1);
}

Test(cxx_new, new_retries_into_memory_the_handler_frees)
{
    /* 192 + 128 MiB is over GRACESLAB_OS_FAIL_AFTER_MB (256), 128 alone
       is not: new fails once, the handler frees the 192, the retry works. */
    int (*frees)(size_t, size_t) = (int (*)(size_t, size_t))sym("plugin_handler_frees_reserve");
    cr_assert_eq(frees((size_t)192 << 20, (size_t)128 << 20), 1);
}

/* ------------------------------------------------------------ bad input */

static void delete_twice(void *arg)
{
    (void)arg;
    void *(*new_bytes)(size_t) = (void *(*)(size_t))sym("plugin_new");
    void (*delete_bytes)(void *) = (void (*)(void *))sym("plugin_delete");
    void *p = new_bytes(64);
    void *keep = new_bytes(64); /* the slab stays in use */
    delete_bytes(p);
    gst_child_report_ptr(p);
    delete_bytes(p);
    (void)keep;
}

static void delete_stack_object(void *arg)
{
    (void)arg;
    void (*sized_delete)(void *, size_t) = (void (*)(void *, size_t))sym("plugin_sized_delete");
    char on_stack[64];
    gst_child_report_ptr(on_stack);
    sized_delete(on_stack, sizeof on_stack);
}

Test(cxx_new, double_delete_aborts_naming_operator_delete)
{
    gst_assert_child_fatal(delete_twice, "operator delete", "double free");
}

Test(cxx_new, delete_of_a_stack_object_aborts_naming_operator_delete)
{
    gst_assert_child_fatal(delete_stack_object, "operator delete", "invalid pointer");
}
