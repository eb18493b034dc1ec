/*
 * A library whose constructor allocates: linked after libgraceslab.so, it
 * is initialised before it (the dynamic loader runs the constructors of a
 * program's libraries in reverse order), so graceslab's first allocation
 * comes before its own constructor runs, as under LD_PRELOAD with C++
 * programs (libstdc++ allocates while it starts). See fork_early_malloc.c.
 */
#include <stdlib.h>

void *gst_early_block;

__attribute__((constructor)) static void allocate_early(void)
{
    gst_early_block = malloc(100);
}
