/*
 * ln_pool.c - the worker pool behind ln_parallel_for.
 *
 * Threads are started on first need and kept. A call posts its task; the
 * caller and the workers then take chunks of items from a shared counter
 * until none are left. The caller waits only for chunks that were taken,
 * never for a worker that has not woken up yet, so a busy machine costs at
 * most the single-thread time.
 *
 * One call uses the pool at a time; a concurrent call (another Python
 * thread: the GIL is released) runs on its own thread instead. A forked
 * child starts with an empty pool.
 */
#include "ln_pool.h"

#if !defined(_WIN32)
#include <pthread.h>
#define LN_HAVE_PTHREADS 1
#endif

/* Begin, run every item, end: the whole task on the calling thread. */
static int run_alone(size_t n_items, size_t chunk, const ln_task *t)
{
    void *state = NULL;
    int status = t->begin(t->ctx, &state);
    if (status != 0)
        return status;
    for (size_t i = 0; i < n_items; i += chunk) {
        size_t end = n_items - i < chunk ? n_items : i + chunk;
        status = t->worse(status, t->run(t->ctx, state, i, end));
    }
    return t->worse(status, t->end(t->ctx, state));
}

#if defined(LN_HAVE_PTHREADS)
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;   /* a task was posted */
    pthread_cond_t idle;   /* the last taken chunk is done */
    size_t n_started;      /* worker threads running */
    unsigned long posted;  /* tasks posted so far */
    /* The current task, valid while task != NULL; guarded by mu. */
    const ln_task *task;
    size_t n_items, next, chunk; /* first item not taken; items per take */
    size_t seats;          /* workers that may still join this task */
    size_t busy;           /* threads inside the task */
    int status;
} ln_pool;

static ln_pool pool = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .idle = PTHREAD_COND_INITIALIZER,
};
static pthread_mutex_t pool_owner = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t pool_fork_once = PTHREAD_ONCE_INIT;

/* Take chunks until none are left. Called with mu held and busy counted;
 * returns with mu held. */
static void take_chunks(const ln_task *t, void *state)
{
    while (pool.next < pool.n_items) {
        size_t i = pool.next;
        size_t end = pool.n_items - i < pool.chunk ? pool.n_items : i + pool.chunk;
        pool.next = end;
        pthread_mutex_unlock(&pool.mu);
        int rc = t->run(t->ctx, state, i, end);
        pthread_mutex_lock(&pool.mu);
        pool.status = t->worse(pool.status, rc);
    }
}

/* Finish a thread's part (its end runs under mu: one at a time), then
 * leave; the last one out wakes the caller. mu held. */
static void leave_task(const ln_task *t, void *state, int began)
{
    if (began)
        pool.status = t->worse(pool.status, t->end(t->ctx, state));
    if (--pool.busy == 0)
        pthread_cond_broadcast(&pool.idle);
}

static void *pool_main(void *arg)
{
    unsigned long seen = 0;
    (void)arg;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (pool.posted == seen)
            pthread_cond_wait(&pool.wake, &pool.mu);
        seen = pool.posted;
        const ln_task *t = pool.task;
        if (t == NULL || pool.seats == 0 || pool.next >= pool.n_items)
            continue; /* finished before this worker woke, or full */
        pool.seats--;
        pool.busy++;
        pthread_mutex_unlock(&pool.mu);
        void *state = NULL;
        int began = t->begin(t->ctx, &state) == 0;
        pthread_mutex_lock(&pool.mu);
        if (began)
            take_chunks(t, state);
        leave_task(t, state, began);
    }
    return NULL;
}

/* A forked child has none of the parent's threads: start afresh. */
static void pool_after_fork_child(void)
{
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.idle, NULL);
    pthread_mutex_init(&pool_owner, NULL);
    pool.n_started = 0;
    pool.task = NULL;
}

static void pool_register_fork(void)
{
    pthread_atfork(NULL, NULL, pool_after_fork_child);
}

/* Make sure n workers run (fewer if threads cannot be created). mu held. */
static void pool_grow(size_t n)
{
    while (pool.n_started < n) {
        pthread_t tid;
        if (pthread_create(&tid, NULL, pool_main, NULL) != 0)
            break;
        pthread_detach(tid);
        pool.n_started++;
    }
}

int ln_parallel_for(size_t n_items, size_t chunk, size_t n_threads,
                    const ln_task *t)
{
    if (chunk == 0)
        chunk = 1;
    if (n_threads > LN_MAX_THREADS)
        n_threads = LN_MAX_THREADS;
    if (n_threads <= 1 || n_items <= chunk ||
        pthread_mutex_trylock(&pool_owner) != 0)
        return run_alone(n_items, chunk, t);
    pthread_once(&pool_fork_once, pool_register_fork);

    void *state = NULL;
    int status = t->begin(t->ctx, &state);
    if (status != 0) {
        pthread_mutex_unlock(&pool_owner);
        return status;
    }
    pthread_mutex_lock(&pool.mu);
    pool_grow(n_threads - 1);
    pool.task = t;
    pool.n_items = n_items;
    pool.next = 0;
    pool.chunk = chunk;
    pool.seats = n_threads - 1;
    pool.busy = 1; /* the caller */
    pool.status = 0;
    pool.posted++;
    pthread_cond_broadcast(&pool.wake);

    take_chunks(t, state);
    leave_task(t, state, 1);
    while (pool.busy > 0)
        pthread_cond_wait(&pool.idle, &pool.mu);
    status = pool.status;
    pool.task = NULL;
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool_owner);
    return status;
}
#else
int ln_parallel_for(size_t n_items, size_t chunk, size_t n_threads,
                    const ln_task *t)
{
    (void)n_threads;
    return run_alone(n_items, chunk == 0 ? 1 : chunk, t);
}
#endif
