/*
 * ln_pool.h - a persistent worker pool with one generic entry point:
 * ln_parallel_for runs task->run over [0, n_items) in chunks on up to
 * n_threads threads (the caller's included). Nothing here knows about
 * records or kernels.
 */
#ifndef LN_POOL_H
#define LN_POOL_H

#include <stddef.h>

/* The most threads one call may use; set_num_threads accepts 1..this. */
#define LN_MAX_THREADS 256

typedef struct {
    void *ctx;
    /* Called once on each thread that takes part, before its first chunk:
     * set up *state. Returns 0, or a nonzero status (the thread then takes
     * no chunk; others carry on). */
    int (*begin)(void *ctx, void **state);
    /* Items [begin, end) on this thread's state; returns a status. */
    int (*run)(void *ctx, void *state, size_t begin, size_t end);
    /* Called once per successful begin, after the thread's last chunk, one
     * thread at a time (merge the thread's results into ctx, free state). */
    int (*end)(void *ctx, void *state);
    /* Combine two statuses (e.g. the worse of the two). */
    int (*worse)(int a, int b);
} ln_task;

/*
 * Run the task; returns the combined status. Every item is run exactly
 * once, by one thread; which thread runs which chunk is unspecified, so
 * results must not depend on it. If the pool is busy with another call, or
 * n_threads <= 1, everything runs on the calling thread. If no thread could
 * begin, the caller's begin status is returned and nothing is run.
 */
int ln_parallel_for(size_t n_items, size_t chunk, size_t n_threads,
                    const ln_task *task);

#endif /* LN_POOL_H */
