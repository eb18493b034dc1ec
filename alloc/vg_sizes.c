/*
 * Under memcheck only: the size memcheck was told for each live block.
 *
 * memcheck checks accesses against the size a program asked for, but a
 * program may use a block up to malloc_usable_size(), and realloc within
 * that size keeps the block where it is (glibc's contract, and graceslab's).
 * Both need memcheck's block resized in place, and its resize request
 * (VALGRIND_RESIZEINPLACE_BLOCK) must name the size it knows: graceslab
 * keeps no requested size of its own, so this table does, while Valgrind
 * runs. Outside Valgrind nothing here is called (gsi_valgrind is false and
 * the fast paths never reach vg.h).
 *
 * An open-addressing table (linear probing, tombstones) in its own
 * mapping, never in a graceslab block: it must not allocate through the
 * allocator it describes. Not counted in gsi_os_mapped_bytes (it is not
 * the program's memory). Keys are stored inverted: memcheck's leak check
 * scans every mapping for pointers, and a plain copy of each block's
 * address here would make every leaked block look reachable. One mutex: Valgrind runs one thread at a time
 * anyway; the lock is for correctness, not speed.
 */
#include "alloc/internal.h"

#include <pthread.h>
#include <sys/mman.h>

#if GS_VALGRIND

#define EMPTY ((uintptr_t)0)
#define TOMBSTONE ((uintptr_t)1)

struct entry {
    uintptr_t block; /* ~address; or EMPTY, TOMBSTONE */
    size_t size;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *table;
static size_t capacity; /* a power of two, or 0 */
static size_t used;     /* live entries plus tombstones */

void gsi_vg_atfork_prepare(void) { pthread_mutex_lock(&table_lock); }
void gsi_vg_atfork_parent(void) { pthread_mutex_unlock(&table_lock); }
void gsi_vg_atfork_child(void) { pthread_mutex_unlock(&table_lock); } /* taken in prepare */

static size_t slot_of(uintptr_t block, size_t cap)
{
    return (size_t)(((block >> 4) * 0x9e3779b97f4a7c15ull) >> 20) & (cap - 1);
}

/* block: an inverted address, as stored. */
static struct entry *find(uintptr_t block)
{
    if (!capacity)
        return NULL;
    for (size_t i = slot_of(block, capacity);; i = (i + 1) & (capacity - 1)) {
        if (table[i].block == block)
            return &table[i];
        if (table[i].block == EMPTY)
            return NULL;
    }
}

/* Keeps the table at most half full, counting tombstones, so probes end.
   False if no memory for a bigger table: the caller then just does not
   record the block (memcheck still knows it; only a later resize of it is
   lost, and resizes of unknown blocks are skipped). */
static bool make_room(void)
{
    if ((used + 1) * 2 <= capacity)
        return true;
    size_t live = 0;
    for (size_t i = 0; i < capacity; i++)
        live += table[i].block > TOMBSTONE;
    size_t cap = 4096;
    while (cap < (live + 1) * 4)
        cap *= 2;
    struct entry *t = mmap(NULL, cap * sizeof *t, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (t == MAP_FAILED)
        return false;
    for (size_t i = 0; i < capacity; i++) {
        if (table[i].block <= TOMBSTONE)
            continue;
        size_t j = slot_of(table[i].block, cap);
        while (t[j].block != EMPTY)
            j = (j + 1) & (cap - 1);
        t[j] = table[i];
    }
    if (table)
        munmap(table, capacity * sizeof *table);
    table = t;
    capacity = cap;
    used = live;
    return true;
}

static void record(uintptr_t block, size_t size)
{
    struct entry *e = find(block);
    if (e) {
        e->size = size;
        return;
    }
    if (!make_room())
        return;
    size_t i = slot_of(block, capacity);
    while (table[i].block > TOMBSTONE)
        i = (i + 1) & (capacity - 1);
    used += table[i].block == EMPTY;
    table[i] = (struct entry){block, size};
}

void gsi_vg_alloc(void *p, size_t size, bool zeroed)
{
    VALGRIND_MALLOCLIKE_BLOCK(p, size, 0, zeroed);
    pthread_mutex_lock(&table_lock);
    record(~(uintptr_t)p, size);
    pthread_mutex_unlock(&table_lock);
}

void gsi_vg_free(void *p)
{
    VALGRIND_FREELIKE_BLOCK(p, 0);
    pthread_mutex_lock(&table_lock);
    struct entry *e = find(~(uintptr_t)p);
    if (e)
        e->block = TOMBSTONE;
    pthread_mutex_unlock(&table_lock);
}

void gsi_vg_resize(const void *p, size_t size)
{
    pthread_mutex_lock(&table_lock);
    struct entry *e = find(~(uintptr_t)p);
    if (e && e->size != size) {
        VALGRIND_RESIZEINPLACE_BLOCK(p, e->size, size, 0);
        e->size = size;
    }
    pthread_mutex_unlock(&table_lock);
}

#else

void gsi_vg_atfork_prepare(void) {}
void gsi_vg_atfork_parent(void) {}
void gsi_vg_atfork_child(void) {}

#endif
