/*
 * ln_cache.h - large output blocks kept for the next call.
 *
 * A block of 32 MiB or more that malloc gives comes from fresh pages (glibc
 * maps such blocks afresh and unmaps them when freed), and the kernel
 * zeroes every page as it is first written: for a float32 (16384, 4096)
 * output that costs about as much as the normalization itself. A loop
 * that calls layer_norm again and again on arrays of one size (training,
 * inference over a data set) frees each output before it asks for the
 * next; keeping a few freed blocks, up to a limit in bytes, lets the next
 * call write into pages that are already there.
 *
 * Blocks are plain malloc blocks; a kept block is handed out again only
 * for a request of exactly its size. Nothing here knows about arrays.
 */
#ifndef LN_CACHE_H
#define LN_CACHE_H

#include <stddef.h>

/* Smaller blocks are never kept: glibc reuses their pages by itself. */
#define LN_CACHE_MIN_BYTES ((size_t)32 << 20)
/* At most this many blocks are kept at a time. */
#define LN_CACHE_SLOTS 4

/* A kept block of exactly `bytes`, now the caller's, or NULL. */
void *ln_cache_take(size_t bytes);

/* The caller's block of `bytes` (from malloc) handed back: kept, or
 * freed when it is small, larger than the limit, or no room can be made
 * for it (older blocks are freed first, oldest first). */
void ln_cache_give(void *block, size_t bytes);

/* Set the limit on the bytes kept (0: keep nothing), freeing kept blocks
 * beyond it; returns the previous limit. */
size_t ln_cache_set_limit(size_t bytes);

/* Free every kept block (the limit stays): when malloc fails, before it
 * is tried again. */
void ln_cache_release(void);

/* The limit, and the bytes and blocks kept now. */
size_t ln_cache_limit(void);
size_t ln_cache_held(size_t *blocks);

#endif /* LN_CACHE_H */
