/*
 * Size classes: 16..128 bytes in steps of 16, then eight classes per
 * doubling (steps of 1/8) up to 256 KiB (GS_SMALL_MAX; malloc looks the
 * classes up to 32 KiB up in direct[], and computes the medium ones).
 * Internal waste is below 16 bytes (alignment) up to 128 B and below 1/9
 * (11.1%) above it.
 *
 * A slab of class c spans enough 64 KiB slots to hold at least 8 objects;
 * above 32 KiB, one of two spans ("Medium spans", below). Its link array
 * (2 bytes per object, plus one sentinel) lives in the segment header for
 * every class from 176 bytes up, and the
 * objects fill the span from its first byte ("Where the links live",
 * below). In the smaller classes the slab's first bytes hold it, at a small
 * offset that differs between slabs (colouring, see gsi_class_color), and
 * objects start at the next multiple of their natural alignment
 * (the largest power of two dividing the size, at most a 64 KiB slot, the
 * alignment of a slab's base). Either way a class whose size is a multiple
 * of A hands out A-aligned objects: aligned_alloc up to 64 KiB is served by
 * ordinary slabs. Aligning the first object that way costs no capacity in
 * any class (the link array's part of the slab never held a whole object),
 * which test_size_class checks.
 */
#include "alloc/internal.h"

struct gs_class_info gsi_classes[GS_NCLASSES];
_Atomic uint8_t gsi_class_of_small[GS_SMALL_CLASS_ENTRIES];

/* Up to a slot (64 KiB), the alignment of every slab's base. */
static size_t natural_align(size_t size)
{
    size_t a = size & -size;
    return a > GS_SLOT_SIZE ? GS_SLOT_SIZE : a;
}

static size_t round_up(size_t v, size_t a)
{
    return (v + a - 1) & ~(a - 1);
}

/* The inverse of an odd number modulo 2^64, by Newton's iteration: each
   step doubles the number of correct low bits (3 from x = d: d * d == 1
   mod 8 for odd d). */
static uint64_t odd_inverse(uint64_t d)
{
    uint64_t x = d;
    for (int i = 0; i < 5; i++)
        x *= 2 - d * x;
    return x;
}

static void class_layout(struct gs_class_info *ci, uint32_t size)
{
    size_t align = natural_align(size);
    /* At least 8 objects per slab; the medium classes have spans of
       their own (below). */
    unsigned span = 1;
    if (size > GS_DIRECT_MAX)
        span = gsi_medium_span(size);
    else
        while (span * GS_SLOT_SIZE < 8 * (size_t)size + GS_PAGE)
            span++;
    size_t bytes = span * GS_SLOT_SIZE;
    size_t n = bytes / size;
    if (n > GS_MAX_OBJECTS)
        n = GS_MAX_OBJECTS;
    if (size > GS_DIRECT_MAX && n > GS_MEDIUM_MAX_OBJECTS)
        n = GS_MEDIUM_MAX_OBJECTS;
    /* Links in the header when that holds as many objects as links in
       the slab would. */
    size_t in_header = n < GS_SLOT_LINK_BYTES / 2 ? n : GS_SLOT_LINK_BYTES / 2 - 1;
    while (n && round_up(2 * (n + 1), align) + n * size > bytes)
        n--;
    ci->size = size;
    if (in_header >= n) {
        ci->capacity = (uint32_t)in_header;
        ci->link_bytes = 0;
        ci->colors = 1;
    } else {
        unsigned colors = 1;
        while (colors < 64 && round_up(colors * 64 + 2 * (n + 1), align) + n * size <= bytes)
            colors++;
        ci->capacity = (uint32_t)n;
        ci->link_bytes = (uint32_t)round_up(2 * (n + 1), align);
        ci->colors = colors;
    }
    ci->span = (uint8_t)span;
    ci->shift = (uint8_t)__builtin_ctz(size);
    ci->inverse = odd_inverse(size >> ci->shift);
}

/* Medium spans. The medium classes (above 32 KiB) have two slab sizes,
   not one each: 16 slots (1 MiB) from 64 KiB up, 9 slots (576 KiB) below,
   at least 4 objects a slab (256 KiB) and at most 16 (decay.c keeps a bit
   per object). A medium slab its heap emptied can then serve any class of
   its span, formatted again in place (heap.c, "Medium reuse"): a buffer
   that grows through the classes, as realloc makes it, reuses the slab
   its smaller size just emptied, whose lines are still in the cache,
   where slabs of one span per class could serve their own class only and
   every class kept its own. The price is the tail a class does not fill:
   at most 3/16 of the span (4 objects of 208 KiB in 1 MiB; 9 of 60 KiB
   leave 36 KiB of 576), where the spans fitted to each class (3..17
   slots) left at most a slot. One span of 16 slots for all would reuse
   more (100 buffers grown side by side to 256 KiB: 41 MB peak RSS
   against 48), but a class of 36 KiB would leave 448 KiB of each slab
   unused, resident when the slots held another slab before. */
unsigned gsi_medium_span(size_t size)
{
    return size >= 65536 ? 16 : 9;
}

/* Where the links live. The link array is what every malloc and free
   reads (the object's state). Even coloured (below), the arrays at the
   front of the slabs sat in few cache sets: most classes have little slack
   (one colour from 16 to 80 bytes, 1 to 5 up to 1 KiB), so the link lines
   of every slab in use shared the sets of the first lines of a 64 KiB
   period. On bench/random (cachegrind with this host's L2: 1 MiB, 8-way,
   sets by address bits 6..16) the link loads took 70 % of the L2 read
   misses, 1.01 per malloc+free. Packed into the segment header, 768 bytes
   a slot, they are dense: 0.29 (tcmalloc 0.66), and 63.6 -> 70.0 M
   pairs/s, interleaved with tcmalloc's 70.4 (docs/benchmarks.md). A class
   gets header links when they hold at least as many objects as front
   links (from 176 bytes up; the objects then fill the span from its first
   byte); below that a slab has more objects than a header row has links,
   and keeps the coloured front array.

   Slab colouring (the classes with front links). The link array is what
   every malloc and free reads (the
   object's state), and it used to start at the slab's first byte, a 64 KiB
   boundary: the L1 (48 KiB, 12-way: sets by address bits 6..11) and L2
   (2 MiB, 16-way: bits 6..16) caches of the test machine put the link
   arrays of all slabs in the same few sets, so with a couple of hundred
   slabs in use they evicted each other (bench/random, cachegrind with that
   geometry: 1.14 L2 misses per malloc+free, 0.74 coloured; tcmalloc 0.48).
   A slab's link array now starts at one of `colors` offsets 64 bytes
   apart, chosen by its address, using only the slack the class already
   has: the capacity is unchanged, and the objects keep their natural
   alignment (they start at the next multiple of it after the links). */
void gsi_class_color(const struct gs_class_info *ci, const void *base, size_t *link_off,
                     size_t *start_off)
{
    size_t color = (((uintptr_t)base >> GS_SLOT_SHIFT) % ci->colors) * 64;
    *link_off = color;
    *start_off = round_up(color + 2 * ((size_t)ci->capacity + 1), natural_align(ci->size));
}

/* direct[] entry i names class k (entries of a class are contiguous). */
static void direct_add(unsigned k, unsigned i)
{
    if (!gsi_classes[k].direct_end)
        gsi_classes[k].direct_first = (uint16_t)i;
    gsi_classes[k].direct_end = (uint16_t)(i + 1);
}

void gsi_classes_init(void)
{
    unsigned c = 0;
    for (uint32_t s = 16; s <= 128; s += 16)
        class_layout(&gsi_classes[c++], s);
    for (uint32_t base = 128; base < GS_SMALL_MAX; base *= 2)
        for (uint32_t k = 1; k <= 8; k++)
            class_layout(&gsi_classes[c++], base + k * (base / 8));
    GS_ASSERT(c == GS_NCLASSES);
    GS_ASSERT(gsi_classes[GS_FIRST_MEDIUM_CLASS - 1].size == GS_DIRECT_MAX);
    for (unsigned k = GS_FIRST_MEDIUM_CLASS; k < GS_NCLASSES; k++) /* decay.c */
        GS_ASSERT(gsi_classes[k].capacity <= 16 && gsi_classes[k].size % GS_PAGE == 0);
    GS_ASSERT(gsi_classes[GS_NCLASSES - 1].size == GS_SMALL_MAX);
    unsigned k = 0;
    for (unsigned i = 0; i <= (1024 >> 4); i++) {
        size_t size = i << 4;
        while (gsi_classes[k].size < size)
            k++;
        atomic_store_explicit(&gsi_class_of_small[i], (uint8_t)k, memory_order_relaxed);
        direct_add(k, i);
    }
    /* Above 1 KiB: entry i covers sizes up to (i - base) * 128. */
    for (unsigned i = GS_DIRECT_INDEX_ABOVE_1K(1025); i < GS_DIRECT_ENTRIES; i++)
        direct_add(gsi_class_above_1k((size_t)(i - GS_DIRECT_BASE_ABOVE_1K) << 7), i);
}

unsigned gsi_class_slow(size_t size)
{
    if (size <= 1024)
        return gsi_small_class(size);
    return gsi_class_above_1k(size);
}

