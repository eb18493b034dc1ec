/*
 * A program run under memcheck by tests/valgrind/run_memcheck.sh, one
 * scenario per argument. Each scenario either must produce no memcheck
 * error, or exactly the error the script expects (an invalid read, a leak).
 */
#include "graceslab.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile char sink;

int main(int argc, char **argv)
{
    const char *s = argc > 1 ? argv[1] : "clean";
    /* Not object 0 of its slab: the slab's start pointer would keep that
       one "reachable" for the leak checker. */
    void *pad = malloc(40);
    char *p = malloc(40);
    strcpy(p, "graceslab");
    if (!strcmp(s, "clean")) {
        char *q = realloc(p, 4000);
        q = realloc(q, 100000);
        q = realloc(q, 300000); /* a medium slab block, then a large one */
        free(q);
    } else if (!strcmp(s, "use_after_free")) {
        free(p);
        sink = p[0]; /* memcheck: invalid read */
    } else if (!strcmp(s, "leak")) {
        p = NULL; /* memcheck: 40 bytes definitely lost */
    } else if (!strcmp(s, "overflow")) {
        sink = p[41]; /* memcheck: invalid read past the block */
        free(p);
    } else if (!strcmp(s, "pending_read")) {
        gs_rcu_read_lock();
        gs_free_rcu(p);
        sink = p[0]; /* a reader during the grace period: allowed */
        gs_rcu_read_unlock();
        gs_reclaim((size_t)-1);
    } else if (!strcmp(s, "read_after_gp")) {
        gs_free_rcu(p);
        gs_reclaim((size_t)-1);
        sink = p[0]; /* after the grace period: invalid read */
    } else if (!strcmp(s, "large_after_gp")) {
        char *big = malloc(1 << 20);
        big[12345] = 1;
        gs_free_rcu(big);
        sink = big[12345]; /* still pending: allowed */
        gs_reclaim((size_t)-1);
        sink = big[12345]; /* invalid read */
        free(p);
    } else if (!strcmp(s, "aligned")) {
        /* Aligned blocks, several of one class (the second and later come
           off the active slab without a refill): all usable, then freed. */
        void *a[16];
        for (int i = 0; i < 16; i++) {
            if (posix_memalign(&a[i], 64, 100))
                return 1;
            memset(a[i], i, 100);
        }
        char *b = aligned_alloc(256, 256), *m = memalign(4096, 3000);
        memset(b, 1, 256);
        memset(m, 2, 3000);
        for (int i = 0; i < 16; i++)
            free(a[i]);
        free(b);
        free(m);
        free(p);
    } else if (!strcmp(s, "aligned_overflow")) {
        void *a[4];
        for (int i = 0; i < 4; i++)
            if (posix_memalign(&a[i], 64, 100))
                return 1;
        sink = ((char *)a[3])[100]; /* memcheck: invalid read past the block */
        for (int i = 0; i < 4; i++)
            free(a[i]);
        free(p);
    } else if (!strcmp(s, "typesafe_read")) {
        /* A GS_CACHE_TYPESAFE_BY_RCU cache: a reader may still read a
           freed object (it stays one of the cache's objects), after
           gs_cache_free and after a gs_cache_free_rcu's grace period. */
        struct gs_cache *c = gs_cache_create("vg", 48, 16, GS_CACHE_TYPESAFE_BY_RCU);
        char *a = gs_cache_alloc(c), *b = gs_cache_alloc(c), *keep = gs_cache_alloc(c);
        memset(a, 1, 48);
        memset(b, 2, 48);
        gs_rcu_read_lock();
        gs_cache_free(c, a);
        sink = a[7]; /* allowed: type-safe memory */
        gs_rcu_read_unlock();
        gs_cache_free_rcu(c, b);
        gs_reclaim((size_t)-1);
        sink = b[7]; /* allowed too, after the grace period */
        gs_cache_free(c, keep);
        gs_cache_destroy(c);
        free(p);
    } else if (!strcmp(s, "cache_use_after_free")) {
        /* Without the flag, a freed cache object is no-access. */
        struct gs_cache *c = gs_cache_create("vg", 48, 16, 0);
        char *a = gs_cache_alloc(c), *keep = gs_cache_alloc(c);
        memset(a, 1, 48);
        gs_cache_free(c, a);
        sink = a[7]; /* memcheck: invalid read */
        gs_cache_free(c, keep);
        gs_cache_destroy(c);
        free(p);
    } else if (!strcmp(s, "usable_size")) {
        /* A program may use a block up to malloc_usable_size(): after the
           call those bytes are its own (small and large blocks). */
        char *big = malloc(300000);
        size_t n = malloc_usable_size(p), nb = malloc_usable_size(big);
        memset(p, 1, n);
        memset(big, 2, nb);
        sink = p[n - 1];
        sink = big[nb - 1];
        free(big);
        free(p);
    } else if (!strcmp(s, "usable_size_overflow")) {
        size_t n = malloc_usable_size(p);
        sink = p[n]; /* memcheck: invalid read past the usable size */
        free(p);
    } else if (!strcmp(s, "realloc_in_place")) {
        /* realloc within the block keeps it in place; memcheck then knows
           the new size: growing gives bytes, shrinking takes them. */
        char *q = realloc(p, 44);
        if (q != p)
            return 1;
        q[43] = 1;
        q = realloc(q, 30);
        if (q != p)
            return 1;
        sink = q[35]; /* memcheck: invalid read past the shrunk block */
        free(q);
    } else if (!strcmp(s, "realloc_room")) {
        /* A block that grows out of its class moves with room to grow
           (malloc.c); memcheck still knows only the size asked for.
           (No malloc_usable_size(q): it would give the program the room.) */
        size_t n = malloc_usable_size(p);
        char *q = realloc(p, n + 1);
        q[n] = 1;
        sink = q[n + 1]; /* memcheck: invalid read past the requested size */
        free(q);
    } else if (!strcmp(s, "calloc_cached_large")) {
        /* calloc reusing a freed large block (the large cache): zeroing
           it is graceslab's write to the new block, not to freed memory. */
        free(malloc(300000));
        char *z = calloc(1, 300000);
        sink = z[299999];
        free(z);
        free(p);
    } else if (!strcmp(s, "slot_reuse")) {
        /* A slab slot formatted for one class, emptied and retired, then
           formatted for a class with a longer link array: graceslab's own
           link-array accesses in that slot must not be memcheck errors
           (run with GRACESLAB_HEAP_EMPTY_KB=0 so the slot is retired at
           once). Then the new blocks are used and freed normally. */
        void *big[32], *small[3000];
        for (int i = 0; i < 32; i++)
            big[i] = malloc(2048);
        for (int i = 0; i < 32; i++)
            free(big[i]);
        for (int i = 0; i < 3000; i++) {
            small[i] = malloc(16);
            memset(small[i], i & 0xff, 16);
        }
        for (int i = 0; i < 3000; i++)
            free(small[i]);
        free(p);
    }
    free(pad);
    return 0;
}
