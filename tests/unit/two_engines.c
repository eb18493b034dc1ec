/*
 * Two graceslab engines in one process: the program's (libgraceslab.so)
 * and a plugin's (libgraceslab.a linked into it, engine_plugin.c). Each
 * must keep its own grace-period state: the archive keeps the names of the
 * inlined read side hidden (GS_INLINE_ABI, alloc/common.h). Were the
 * plugin's copy to bind to the program's gsi_rcu_gp_v3, its grace periods
 * (which scan only its own registry) would advance the program's sequence
 * and end the program's grace periods with its readers inside.
 * Usage: two_engines /path/to/libengine_plugin.so
 */
#include "graceslab.h"
#include "../common.h"

#include <dlfcn.h>

static void *reader_main(void *arg)
{
    atomic_int *state = arg; /* 0 start, 1 inside, 2 leave, 3 left */
    gs_rcu_read_lock();
    atomic_store(state, 1);
    while (atomic_load(state) != 2)
        gst_sleep_ms(1);
    gs_rcu_read_unlock();
    atomic_store(state, 3);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: two_engines PLUGIN\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "two_engines: dlopen: %s\n", dlerror());
        return 1;
    }
    void (*plugin_sync)(void) = (void (*)(void))dlsym(h, "plugin_sync");
    const void *(*plugin_gp_state)(void) = (const void *(*)(void))dlsym(h, "plugin_gp_state");
    if (!plugin_sync || !plugin_gp_state) {
        fprintf(stderr, "two_engines: plugin symbols missing\n");
        return 1;
    }
    int failed = 0;
    if (plugin_gp_state() == (const void *)&gsi_rcu_gp_v3) {
        fprintf(stderr, "FAIL: the plugin reads the program's grace-period state\n");
        failed = 1;
    }

    atomic_int state = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, reader_main, &state) != 0) {
        fprintf(stderr, "two_engines: pthread_create failed\n");
        return 1;
    }
    while (atomic_load(&state) != 1)
        gst_sleep_ms(1);
    unsigned long cookie = gs_rcu_get_state();
    plugin_sync(); /* the plugin's grace period: not the program's */
    if (gs_rcu_poll_state(cookie)) {
        fprintf(stderr, "FAIL: the program's grace period ended with its reader inside "
                        "(after the plugin's gs_synchronize_rcu)\n");
        failed = 1;
    }
    atomic_store(&state, 2);
    pthread_join(t, NULL);
    gs_synchronize_rcu();
    if (!gs_rcu_poll_state(cookie)) {
        fprintf(stderr, "FAIL: the program's grace period did not end after its reader left\n");
        failed = 1;
    }
    if (!failed)
        printf("two_engines: each engine keeps its own grace periods\n");
    return failed;
}
