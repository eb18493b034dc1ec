/*
 * Memory pressure: what graceslab does when the OS refuses memory, and
 * gs_reclaim(). The allocator's own slow path is the reclaim path (there is
 * no shrinker): before giving up, give back every cached empty slab and
 * large block so that the retry can map fresh memory.
 */
#include "alloc/internal.h"

bool gsi_oom_reclaim(void)
{
    size_t freed = gsi_segments_purge(true);
    freed += gsi_large_trim(true);
    return freed > 0;
}
