/*
 * ln_cache.c - large output blocks kept for the next call (ln_cache.h).
 *
 * The slots are ordered oldest first. One mutex guards them: blocks are
 * given back from whichever thread drops the last reference to an output.
 */
#include "ln_cache.h"

#include <stdlib.h>

#if !defined(_WIN32)
#include <pthread.h>
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static void cache_lock(void) { pthread_mutex_lock(&cache_mu); }
static void cache_unlock(void) { pthread_mutex_unlock(&cache_mu); }
#else
/* Without pthreads the callers hold Python's GIL, which serializes them. */
static void cache_lock(void) {}
static void cache_unlock(void) {}
#endif

typedef struct {
    void *block;
    size_t bytes;
} ln_kept;

static ln_kept kept[LN_CACHE_SLOTS]; /* [0, n_kept), oldest first */
static size_t n_kept, held, limit;

/* Remove slot i, keeping the order of the others; returns its block. */
static ln_kept remove_slot(size_t i)
{
    ln_kept k = kept[i];
    for (size_t j = i + 1; j < n_kept; j++)
        kept[j - 1] = kept[j];
    n_kept--;
    held -= k.bytes;
    return k;
}

/* Take out the oldest blocks until at most `max_held` bytes in at most
 * `max_blocks` blocks are kept; called with the lock held. The caller
 * frees them once the lock is released: their pages may take a while to
 * unmap. */
static size_t evict(size_t max_held, size_t max_blocks, ln_kept *freed)
{
    size_t n = 0;
    while (n_kept > max_blocks || held > max_held)
        freed[n++] = remove_slot(0);
    return n;
}

static void free_all(const ln_kept *freed, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(freed[i].block);
}

void *ln_cache_take(size_t bytes)
{
    void *block = NULL;
    cache_lock();
    for (size_t i = n_kept; i-- > 0;) { /* the newest first: its pages are warmest */
        if (kept[i].bytes == bytes) {
            block = remove_slot(i).block;
            break;
        }
    }
    cache_unlock();
    return block;
}

void ln_cache_give(void *block, size_t bytes)
{
    ln_kept freed[LN_CACHE_SLOTS];
    size_t n = 0;
    int keep = 0;
    cache_lock();
    if (bytes >= LN_CACHE_MIN_BYTES && bytes <= limit) { /* room for one more block */
        n = evict(limit - bytes, LN_CACHE_SLOTS - 1, freed);
        kept[n_kept++] = (ln_kept){.block = block, .bytes = bytes};
        held += bytes;
        keep = 1;
    }
    cache_unlock();
    free_all(freed, n);
    if (!keep)
        free(block);
}

size_t ln_cache_set_limit(size_t bytes)
{
    ln_kept freed[LN_CACHE_SLOTS];
    cache_lock();
    size_t previous = limit;
    limit = bytes;
    size_t n = evict(limit, LN_CACHE_SLOTS, freed);
    cache_unlock();
    free_all(freed, n);
    return previous;
}

void ln_cache_release(void)
{
    ln_kept freed[LN_CACHE_SLOTS];
    cache_lock();
    size_t n = evict(0, 0, freed);
    cache_unlock();
    free_all(freed, n);
}

size_t ln_cache_limit(void)
{
    cache_lock();
    size_t l = limit;
    cache_unlock();
    return l;
}

size_t ln_cache_held(size_t *blocks)
{
    cache_lock();
    size_t h = held;
    *blocks = n_kept;
    cache_unlock();
    return h;
}
