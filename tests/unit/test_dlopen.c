/*
 * dlopen and RTLD_DEEPBIND (alloc/dlopen.c). A plugin opened with
 * RTLD_DEEPBIND would bind libc's malloc and free while the program uses
 * graceslab's; graceslab's dlopen clears the flag unless
 * GRACESLAB_DEEPBIND=1. Registered twice in meson, with and without that
 * variable: each test states what it expects in both (the one that cannot
 * hold with the variable set is filtered out of that run).
 *
 * The plugin sits beside this program, which finds it through its RUNPATH
 * ($ORIGIN, set in meson.build): a bare name and an $ORIGIN path resolve
 * only if libc's dlopen sees this program, not graceslab, as its caller.
 */
#include <criterion/criterion.h>

#include <graceslab.h>

#include <dlfcn.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#define PLUGIN "libgs_deepbind_plugin.so"

static bool deepbind_kept(void)
{
    const char *v = getenv("GRACESLAB_DEEPBIND");
    return v && strcmp(v, "1") == 0;
}

static void *open_plugin(const char *name)
{
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    cr_assert_not_null(h, "dlopen(%s): %s", name, dlerror());
    return h;
}

static void *sym(void *h, const char *name)
{
    void *f = dlsym(h, name);
    cr_assert_not_null(f, "dlsym(%s): %s", name, dlerror());
    return f;
}

Test(dlopen, bare_name_resolves_along_the_callers_runpath)
{
    void *h = open_plugin(PLUGIN);
    cr_assert_eq(dlclose(h), 0);
}

Test(dlopen, origin_is_the_callers_directory)
{
    void *h = open_plugin("$ORIGIN/" PLUGIN);
    cr_assert_eq(dlclose(h), 0);
}

Test(dlopen, deepbind_plugin_binds_graceslab_malloc_unless_kept)
{
    void *h = open_plugin(PLUGIN);
    void *(*free_address)(void) = (void *(*)(void))sym(h, "plugin_free_address");
    void *(*malloc_address)(void) = (void *(*)(void))sym(h, "plugin_malloc_address");
    if (deepbind_kept()) {
        /* The flag reached libc: the plugin found libc's own. */
        cr_assert_neq(free_address(), (void *)&gs_free, "GRACESLAB_DEEPBIND=1 ignored");
        cr_assert_neq(malloc_address(), (void *)&gs_malloc, "GRACESLAB_DEEPBIND=1 ignored");
    } else {
        cr_assert_eq(free_address(), (void *)&gs_free, "plugin's free is not graceslab's");
        cr_assert_eq(malloc_address(), (void *)&gs_malloc, "plugin's malloc is not graceslab's");
    }
    dlclose(h);
}

/* Blocks cross both ways: the crash this file exists for. Not run with
   GRACESLAB_DEEPBIND=1 (meson.build filters it out): there it is that
   crash. */
Test(dlopen, program_and_deepbind_plugin_share_blocks)
{
    cr_assert(!deepbind_kept(), "run with GRACESLAB_DEEPBIND=1: meson.build filters this test out");
    void *h = open_plugin(PLUGIN);
    char *(*plugin_strdup)(const char *) = (char *(*)(const char *))sym(h, "plugin_strdup");
    void (*plugin_free)(void *) = (void (*)(void *))sym(h, "plugin_free");
    for (int i = 0; i < 1000; i++) {
        char *mine = malloc(100 + (size_t)i);
        memset(mine, 'm', 100);
        plugin_free(mine);
        char *theirs = plugin_strdup("allocated by the plugin");
        cr_assert_str_eq(theirs, "allocated by the plugin");
        cr_assert_eq(gs_usable_size(theirs), 32, "plugin block not from graceslab's 32 B class");
        free(theirs);
    }
    dlclose(h);
}
