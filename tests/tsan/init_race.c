/*
 * Initialisation and the first allocations of a process under
 * ThreadSanitizer (a plain program, like alloc_tsan: exit 0 on success;
 * a TSan report makes it exit 66).
 *
 * What initialisation sets (whether memcheck runs, the class table) is
 * read later by any thread that frees a block. That read is ordered after
 * the write only if the block's allocation itself came after
 * initialisation, whatever path it took: here the process's very first
 * allocation is a large block, made by one thread and freed by another,
 * while a third thread's first small allocation runs initialisation. The
 * three threads are ordered by relaxed flags only, which give TSan no
 * happens-before edge: only the allocator's own ordering may supply one.
 */
#include "graceslab.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static _Atomic(void *) large_block;
static atomic_bool small_done;

static void *make_large(void *arg)
{
    (void)arg;
    void *p = gs_malloc(1 << 20); /* the process's first allocation */
    if (!p) {
        fprintf(stderr, "init_race: large allocation failed\n");
        exit(1);
    }
    atomic_store_explicit(&large_block, p, memory_order_release);
    return NULL;
}

static void *make_small(void *arg)
{
    (void)arg;
    /* Wait for the large block (relaxed: no edge to make_large). */
    while (!atomic_load_explicit(&large_block, memory_order_relaxed)) {
    }
    void *p = gs_malloc(64);
    if (!p) {
        fprintf(stderr, "init_race: small allocation failed\n");
        exit(1);
    }
    gs_free(p);
    atomic_store_explicit(&small_done, true, memory_order_relaxed);
    return NULL;
}

static void *free_large(void *arg)
{
    (void)arg;
    void *p;
    /* Acquire: the block's contents and everything its maker did before. */
    while (!(p = atomic_load_explicit(&large_block, memory_order_acquire))) {
    }
    /* After the small allocation in time, with no edge to it. */
    while (!atomic_load_explicit(&small_done, memory_order_relaxed)) {
    }
    gs_free(p);
    return NULL;
}

int main(void)
{
    pthread_t t[3];
    pthread_create(&t[0], NULL, free_large, NULL);
    pthread_create(&t[1], NULL, make_small, NULL);
    pthread_create(&t[2], NULL, make_large, NULL);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    puts("init_race: ok");
    return 0;
}
