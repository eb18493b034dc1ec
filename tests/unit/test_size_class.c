/*
 * Size classes (alloc/size_class.c): the class table, size -> class
 * mapping, waste bound, slab layout, index computation, aligned classes.
 * Linked with the static archive: everything here is internal.
 */
#include <criterion/criterion.h>

#include "alloc/internal.h"

static void init(void)
{
    gsi_heap_init_once(); /* builds the class tables */
}

TestSuite(size_class, .init = init);

static size_t natural_align(size_t size)
{
    size_t a = size & -size;
    return a > GS_SLOT_SIZE ? GS_SLOT_SIZE : a;
}

static size_t round_up(size_t v, size_t a)
{
    return (v + a - 1) & ~(a - 1);
}

Test(size_class, table_shape)
{
    cr_assert_eq(gsi_classes[0].size, 16);
    cr_assert_eq(gsi_classes[GS_NCLASSES - 1].size, GS_SMALL_MAX);
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        cr_assert_eq(gsi_classes[c].size % 16, 0, "class %u size %u not a multiple of 16", c,
                     gsi_classes[c].size);
        if (c)
            cr_assert_gt(gsi_classes[c].size, gsi_classes[c - 1].size, "class %u not increasing",
                         c);
    }
}

/* Every size maps to the smallest class that holds it, both through the
   inline mapping and the slow one. */
Test(size_class, smallest_fitting_class)
{
    for (size_t size = 0; size <= GS_SMALL_MAX; size++) {
        unsigned c = gsi_size_class(size);
        cr_assert_lt(c, GS_NCLASSES, "size %zu -> class %u out of range", size, c);
        cr_assert_geq(gsi_classes[c].size, size, "size %zu -> class %u (%u B) too small", size,
                      c, gsi_classes[c].size);
        if (c)
            cr_assert_lt(gsi_classes[c - 1].size, size,
                         "size %zu -> class %u (%u B) but class %u (%u B) fits", size, c,
                         gsi_classes[c].size, c - 1, gsi_classes[c - 1].size);
        cr_assert_eq(gsi_class_slow(size), c, "slow mapping disagrees for %zu", size);
    }
}

Test(size_class, small_table_matches_classes)
{
    for (unsigned i = 0; i <= (1024 >> 4); i++) {
        unsigned c = gsi_class_of_small[i];
        size_t size = (size_t)i << 4;
        cr_assert_geq(gsi_classes[c].size, size);
        cr_assert(c == 0 || gsi_classes[c - 1].size < size, "table entry %u not minimal", i);
    }
}

/* malloc's direct[] index of every size up to GS_DIRECT_MAX names the
   size's class: the class's [direct_first, direct_end) holds it, the
   ranges of the classes are disjoint and in order, and together they cover
   every entry; the medium classes above have none. */
Test(size_class, direct_entries_name_the_class_of_every_size)
{
    for (size_t size = 0; size <= GS_DIRECT_MAX; size++) {
        size_t i = GS_DIRECT_INDEX(size);
        cr_assert_lt(i, GS_DIRECT_ENTRIES, "size %zu: entry %zu out of the array", size, i);
        const struct gs_class_info *ci = &gsi_classes[gsi_size_class(size)];
        cr_assert(ci->direct_first <= i && i < ci->direct_end,
                  "size %zu: entry %zu outside its class's [%u, %u)", size, i, ci->direct_first,
                  ci->direct_end);
    }
    unsigned next = 0;
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        if (gsi_classes[c].size > GS_DIRECT_MAX) {
            cr_assert_eq(gsi_classes[c].direct_end, 0, "medium class %u has direct entries", c);
            continue;
        }
        cr_assert_eq(gsi_classes[c].direct_first, next, "class %u starts at %u, not %u", c,
                     gsi_classes[c].direct_first, next);
        cr_assert_gt(gsi_classes[c].direct_end, next, "class %u has no entry", c);
        next = gsi_classes[c].direct_end;
    }
    cr_assert_eq(next, GS_DIRECT_ENTRIES);
}

/* Waste: below 16 bytes up to 128 B, at most 12.5% of the request above. */
Test(size_class, waste_bound)
{
    for (size_t size = 1; size <= GS_SMALL_MAX; size++) {
        size_t cs = gsi_classes[gsi_size_class(size)].size;
        if (size <= 128)
            cr_assert_lt(cs - size, 16, "size %zu -> %zu wastes %zu", size, cs, cs - size);
        else
            cr_assert_leq((cs - size) * 8, size, "size %zu -> %zu wastes more than 12.5%%",
                          size, cs);
    }
}

/* The links' place and the most objects each place holds in a span of
   `bytes`: in the segment header (a row of GS_SLOT_LINK_BYTES), or at the
   front of the slab with the first object naturally aligned. */
static size_t header_fit(const struct gs_class_info *ci, size_t bytes)
{
    size_t n = bytes / ci->size;
    if (n > GS_MAX_OBJECTS)
        n = GS_MAX_OBJECTS;
    if (ci->size > GS_DIRECT_MAX && n > GS_MEDIUM_MAX_OBJECTS)
        n = GS_MEDIUM_MAX_OBJECTS;
    return n < GS_SLOT_LINK_BYTES / 2 ? n : GS_SLOT_LINK_BYTES / 2 - 1;
}

static size_t front_fit(const struct gs_class_info *ci, size_t bytes, size_t first_align)
{
    size_t n = bytes / ci->size;
    while (n > GS_MAX_OBJECTS || round_up(2 * (n + 1), first_align) + n * ci->size > bytes)
        n--;
    return n;
}

/* The layout of each class's slab: links in the header, the whole span for
   objects, or links first and objects aligned to their natural alignment;
   everything inside the span, at least 8 objects (4 in the medium
   classes), object indices fit the 12-bit links, and the place holding more
   objects chosen. */
Test(size_class, slab_layout)
{
    unsigned in_header = 0;
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        const struct gs_class_info *ci = &gsi_classes[c];
        size_t bytes = (size_t)ci->span * GS_SLOT_SIZE;
        cr_assert_geq(ci->span, 1);
        cr_assert_lt(ci->span, GS_SLOTS);
        cr_assert_geq(ci->capacity, ci->size > GS_DIRECT_MAX ? 4 : 8,
                      "class %u (%u B): only %u objects", c, ci->size, ci->capacity);
        cr_assert_leq(ci->capacity, GS_MAX_OBJECTS);
        size_t front = front_fit(ci, bytes, natural_align(ci->size));
        if (gsi_class_header_links(ci)) {
            in_header++;
            cr_assert_eq(ci->link_bytes, 0);
            cr_assert_leq(2 * (ci->capacity + 1), GS_SLOT_LINK_BYTES,
                          "class %u: links overflow the header row", c);
            cr_assert_leq((size_t)ci->capacity * ci->size, bytes,
                          "class %u: objects overflow the span", c);
            cr_assert_eq(ci->capacity, header_fit(ci, bytes), "class %u: not full", c);
            cr_assert_geq(ci->capacity, front, "class %u: front links would hold more", c);
            continue;
        }
        cr_assert_lt(header_fit(ci, bytes), ci->capacity,
                     "class %u: header links would hold as many", c);
        cr_assert_geq(ci->link_bytes, 2 * (ci->capacity + 1), "class %u: link array too short",
                      c);
        cr_assert_eq(ci->link_bytes % natural_align(ci->size), 0,
                     "class %u: first object misaligned", c);
        cr_assert_leq(ci->link_bytes + (size_t)ci->capacity * ci->size, bytes,
                      "class %u: objects overflow the span", c);
        cr_assert_eq(ci->capacity, front, "class %u: room for another object", c);
        /* Aligning the first object beyond a page (up to a slot, for
           aligned_alloc) costs no object: as many fit as with the first
           object at most a page in. */
        size_t page_align = natural_align(ci->size) < GS_PAGE ? natural_align(ci->size) : GS_PAGE;
        cr_assert_eq(ci->capacity, front_fit(ci, bytes, page_align),
                     "class %u (%u B): %u objects, more with page alignment", c, ci->size,
                     ci->capacity);
    }
    /* The header holds the links of every class from 176 bytes up (as the
       comment in size_class.c says), and of no smaller one. */
    cr_assert_eq(gsi_classes[GS_NCLASSES - in_header].size, 176, "header links from %u B",
                 gsi_classes[GS_NCLASSES - in_header].size);
    for (unsigned c = GS_NCLASSES - in_header; c < GS_NCLASSES; c++)
        cr_assert(gsi_class_header_links(&gsi_classes[c]), "class %u in the middle of the header ones", c);
}

/* Medium slabs (alloc/size_class.c, "Medium spans"): two spans, 9 slots
   below 64 KiB and 16 from 64 KiB, so that an emptied slab serves any
   class of its span; 4 to 16 objects (decay's masks have 16 bits), the
   objects filling the span from its first byte, and the tail no class
   fills at most 3/16 of it. */
Test(size_class, medium_spans)
{
    for (unsigned c = GS_FIRST_MEDIUM_CLASS; c < GS_NCLASSES; c++) {
        const struct gs_class_info *ci = &gsi_classes[c];
        size_t bytes = (size_t)ci->span * GS_SLOT_SIZE, used = (size_t)ci->capacity * ci->size;
        cr_assert_eq(ci->span, ci->size < 65536 ? 9u : 16u, "class %u (%u B): %u slots", c,
                     ci->size, ci->span);
        cr_assert(ci->capacity >= 4 && ci->capacity <= GS_MEDIUM_MAX_OBJECTS,
                  "class %u (%u B): %u objects", c, ci->size, ci->capacity);
        cr_assert(gsi_class_header_links(ci), "class %u: front links", c);
        cr_assert_leq((bytes - used) * 16, bytes * 3, "class %u (%u B): %zu KiB of %zu unused",
                      c, ci->size, (bytes - used) >> 10, bytes >> 10);
    }
}

/* Colouring (gsi_class_color), for the classes with front links: at every
   colour a slab of the class has its whole link array before its first
   object, the first object naturally aligned, every object inside the
   span; colour 0 is the layout above, and slabs at consecutive slots take
   different colours when there are some. */
Test(size_class, slab_colors)
{
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        const struct gs_class_info *ci = &gsi_classes[c];
        if (gsi_class_header_links(ci))
            continue;
        size_t bytes = (size_t)ci->span * GS_SLOT_SIZE;
        cr_assert_geq(ci->colors, 1);
        cr_assert_leq(ci->colors, 64);
        for (unsigned k = 0; k < ci->colors + 1; k++) {
            /* A base whose slot number is 64 + k: colour (64 + k) mod colors. */
            const char *base = (const char *)((uintptr_t)(64 + k) << GS_SLOT_SHIFT);
            size_t link_off, start_off;
            gsi_class_color(ci, base, &link_off, &start_off);
            cr_assert_eq(link_off, (size_t)((64 + k) % ci->colors) * 64, "class %u colour %u", c, k);
            cr_assert_geq(start_off, link_off + 2 * (ci->capacity + 1),
                          "class %u colour %u: links overlap the objects", c, k);
            cr_assert_eq(start_off % natural_align(ci->size), 0,
                         "class %u colour %u: first object misaligned", c, k);
            cr_assert_leq(start_off + (size_t)ci->capacity * ci->size, bytes,
                          "class %u colour %u: objects overflow the span", c, k);
            if (link_off == 0)
                cr_assert_eq(start_off, ci->link_bytes);
        }
    }
    /* 96 and 112 bytes have 64 bytes of slack beyond their links: two
       colours. */
    cr_assert_eq(gsi_classes[gsi_size_class(96)].colors, 2);
    cr_assert_eq(gsi_classes[gsi_size_class(112)].colors, 2);
}

/* The index computation (inverse and rotate) is exact for every offset in
   every class's slab: gsi_slab_index() accepts exactly the object starts
   below capacity, and rejects the slab's tail, addresses below the first
   object and far-away addresses (a non-canonical alias). */
Test(size_class, slab_index_exact)
{
    for (unsigned c = 0; c < GS_NCLASSES; c++) {
        const struct gs_class_info *ci = &gsi_classes[c];
        cr_assert_eq((uint64_t)(ci->size >> ci->shift) * ci->inverse, 1,
                     "class %u: inverse of the odd part", c);
        cr_assert_eq((uint32_t)(ci->size >> ci->shift) << ci->shift, ci->size);
        struct gs_slab s = {0};
        s.start = (char *)((uintptr_t)1 << 30);
        s.obj_size = ci->size;
        s.inverse = ci->inverse;
        s.shift = ci->shift;
        s.limit = ci->capacity;
        size_t limit = (size_t)ci->span * GS_SLOT_SIZE;
        for (uint64_t off = 0; off < limit; off++) {
            long idx = gsi_slab_index(&s, s.start + off);
            long want = off % ci->size || off / ci->size >= ci->capacity ? -1 : (long)(off / ci->size);
            if (idx != want)
                cr_assert_fail("class %u: gsi_slab_index(+%lu) = %ld, expected %ld", c,
                        (unsigned long)off, idx, want);
        }
        for (uint64_t back = 1; back <= 4 * GS_SLOT_SIZE; back++)
            if (gsi_slab_index(&s, s.start - back) != -1)
                cr_assert_fail("class %u: start - %lu accepted", c, (unsigned long)back);
        char *alias = (char *)((uintptr_t)s.start | ((uintptr_t)1 << 47));
        cr_assert_eq(gsi_slab_index(&s, alias), -1, "class %u: non-canonical alias accepted", c);
        cr_assert_eq(gsi_slab_index(&s, alias + ci->size), -1);
    }
}

/* gsi_class_aligned: the smallest class that holds size and whose objects
   are all align-aligned; -1 beyond a slot (64 KiB) or beyond the slab
   classes. */
/* Every size, against a search of the class table (gsi_class_aligned
   computes it by rounding instead). */
Test(size_class, aligned_classes)
{
    for (size_t align = 16; align <= GS_SLOT_SIZE; align *= 2) {
        for (size_t size = 0; size <= GS_SMALL_MAX + 1; size++) {
            int c = gsi_class_aligned(size, align);
            int want = -1;
            for (unsigned k = 0; k < GS_NCLASSES && want < 0; k++)
                if (gsi_classes[k].size >= size && gsi_classes[k].size >= align &&
                    natural_align(gsi_classes[k].size) >= align)
                    want = (int)k;
            if (c != want)
                cr_assert_eq(c, want, "gsi_class_aligned(%zu, %zu) = %d, expected %d", size,
                             align, c, want);
            if (c >= 0 && gsi_classes[c].link_bytes % align != 0)
                cr_assert_fail("class %d: link_bytes %u not a multiple of %zu", c,
                               (unsigned)gsi_classes[c].link_bytes, align);
        }
    }
    cr_assert_geq(gsi_class_aligned(64, GS_SLOT_SIZE), 0);
    cr_assert_eq(gsi_class_aligned(64, 2 * GS_SLOT_SIZE), -1);
    cr_assert_eq(gsi_class_aligned(GS_SMALL_MAX - GS_SLOT_SIZE + 1, GS_SLOT_SIZE),
                 (int)GS_NCLASSES - 1);
    cr_assert_eq(gsi_class_aligned(GS_SMALL_MAX + 1, 16), -1);
}
