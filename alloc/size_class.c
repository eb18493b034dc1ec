/*
 * Size classes: 16..128 bytes in steps of 16, then eight classes per
 * doubling (steps of 1/8) up to 32 KiB. Internal waste is below 16 bytes
 * (alignment) up to 128 B and below 1/9 (11.1%) above it.
 *
 * A slab of class c spans enough 64 KiB slots to hold at least 8 objects.
 * Its first bytes hold the link array (2 bytes per object, plus one
 * sentinel); objects start at the next multiple of their natural alignment
 * (the largest power of two dividing the size, at most a page), so a class
 * whose size is a multiple of A hands out A-aligned objects: aligned_alloc
 * up to a page is served by ordinary slabs.
 */
#include "alloc/internal.h"

struct gs_class_info gsi_classes[GS_NCLASSES];
_Atomic uint8_t gsi_class_of_small[(1024 >> 4) + 1];

static size_t natural_align(size_t size)
{
    size_t a = size & -size;
    return a > GS_PAGE ? GS_PAGE : a;
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
    unsigned span = 1;
    while (span * GS_SLOT_SIZE < 8 * (size_t)size + GS_PAGE)
        span++;
    size_t bytes = span * GS_SLOT_SIZE;
    size_t n = bytes / size;
    if (n > GS_MAX_OBJECTS)
        n = GS_MAX_OBJECTS;
    while (n && round_up(2 * (n + 1), align) + n * size > bytes)
        n--;
    ci->size = size;
    ci->capacity = (uint32_t)n;
    ci->link_bytes = (uint32_t)round_up(2 * (n + 1), align);
    ci->span = (uint8_t)span;
    ci->shift = (uint8_t)__builtin_ctz(size);
    ci->inverse = odd_inverse(size >> ci->shift);
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
    GS_ASSERT(gsi_classes[GS_NCLASSES - 1].size == GS_SMALL_MAX);
    unsigned k = 0;
    for (unsigned i = 0; i <= (1024 >> 4); i++) {
        size_t size = i << 4;
        while (gsi_classes[k].size < size)
            k++;
        atomic_store_explicit(&gsi_class_of_small[i], (uint8_t)k, memory_order_relaxed);
        direct_add(k, i);
    }
    /* Above 1 KiB: entry i covers sizes up to (i - 56) * 128. */
    for (unsigned i = GS_DIRECT_INDEX_ABOVE_1K(1025); i < GS_DIRECT_ENTRIES; i++)
        direct_add(gsi_class_above_1k((size_t)(i - 56) << 7), i);
}

unsigned gsi_class_slow(size_t size)
{
    if (size <= 1024)
        return gsi_small_class(size);
    return gsi_class_above_1k(size);
}

int gsi_class_aligned(size_t size, size_t align)
{
    if (size > GS_SMALL_MAX || align > GS_PAGE)
        return -1;
    for (unsigned c = gsi_size_class(size < align ? align : size); c < GS_NCLASSES; c++)
        if (natural_align(gsi_classes[c].size) >= align)
            return (int)c;
    return -1;
}
