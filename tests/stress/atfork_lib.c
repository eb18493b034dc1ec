/*
 * A library whose constructor registers fork handlers that allocate, as
 * glibc allows (its own malloc is locked after every prepare handler and
 * unlocked before every parent and child handler), and registers more of
 * them than glibc's handler list holds without allocating (48), before
 * anything in the process has allocated. Linked after libgraceslab.so, it
 * is initialised before it (see early_malloc_lib.c). See fork_handlers.c.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HANDLERS 60

/* Blocks the handlers allocate, for fork_handlers.c to check and free. */
void *gst_prepare_block[HANDLERS];
void *gst_after_block[HANDLERS];
int gst_handlers_registered;

static int next_prepare, next_after; /* forks come from one thread */

/* glibc runs prepare handlers last-registered first, and parent/child
   handlers first-registered first; the handlers count their runs. */
static void prepare(void)
{
    int i = next_prepare++ % HANDLERS;
    gst_prepare_block[i] = malloc(1000 + (size_t)i * i * 97); /* small, medium, large */
    if (gst_prepare_block[i])
        memset(gst_prepare_block[i], i, 100);
}

static void after(void)
{
    int i = next_after++ % HANDLERS;
    free(gst_after_block[i]);
    gst_after_block[i] = malloc(300000 + (size_t)i);
}

__attribute__((constructor)) static void register_handlers(void)
{
    /* A hang here comes before main can set its own alarm: SIGALRM's
       default action ends the process (main sets the alarm again). */
    alarm(120);
    for (int i = 0; i < HANDLERS; i++)
        if (pthread_atfork(prepare, after, after) == 0)
            gst_handlers_registered++;
}
