/*
 * A plugin that carries its own graceslab: libgraceslab.a linked into a
 * shared object with -Wl,-Bsymbolic-functions (Debian's default for its
 * packaged libraries), loaded by two_engines.c next to libgraceslab.so.
 */
#include "graceslab.h"

void plugin_sync(void);
const void *plugin_gp_state(void);

void plugin_sync(void)
{
    gs_synchronize_rcu();
}

/* Which grace-period state this plugin's code (the inlined read side
   too) reads. */
const void *plugin_gp_state(void)
{
    return &gsi_rcu_gp_v3;
}
