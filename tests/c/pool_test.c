/*
 * pool_test.c - ln_parallel_for on its own, with no kernel in sight
 * (tests/test_pool.py compiles and runs it). Prints one line per failed
 * expectation and exits 1 if there was any.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ln_pool.h"

static int failures;

static void expect(int ok, const char *what, size_t a, size_t b)
{
    if (!ok) {
        printf("FAIL: %s (%zu, %zu)\n", what, a, b);
        failures++;
    }
}

/* What a task records: how often each item ran, the begins and ends, and
 * whether two ends ever overlapped (they must come one at a time). */
typedef struct {
    atomic_int *hits;
    atomic_int begins, ends, in_end, ends_overlapped;
    int fail_begin_from; /* begins numbered from this one fail (-1: none) */
    int run_status;      /* what run returns for odd chunks */
    size_t nest;         /* items per nested call made from run (0: none) */
} probe;

static int p_begin(void *ctx, void **state)
{
    probe *p = ctx;
    int k = atomic_fetch_add(&p->begins, 1);
    *state = p;
    return p->fail_begin_from >= 0 && k >= p->fail_begin_from ? 7 : 0;
}

static int p_worse(int a, int b) { return a > b ? a : b; }

static int p_end(void *ctx, void *state)
{
    probe *p = ctx;
    if (atomic_fetch_add(&p->in_end, 1) != 0)
        atomic_store(&p->ends_overlapped, 1);
    struct timespec pause = {0, 200000}; /* widen the window an overlap would need */
    nanosleep(&pause, NULL);
    atomic_fetch_sub(&p->in_end, 1);
    atomic_fetch_add(&p->ends, 1);
    return state == ctx ? 0 : 9;
}

static int p_run(void *ctx, void *state, size_t begin, size_t end);

static int run_probe(probe *p, size_t n, size_t chunk, size_t threads)
{
    ln_task t = {.ctx = p, .begin = p_begin, .run = p_run, .end = p_end, .worse = p_worse};
    return ln_parallel_for(n, chunk, threads, &t);
}

static int p_run(void *ctx, void *state, size_t begin, size_t end)
{
    probe *p = ctx;
    (void)state;
    for (size_t i = begin; i < end; i++)
        atomic_fetch_add(&p->hits[i], 1);
    if (p->nest) { /* a call while the pool is busy runs on this thread */
        probe q;
        memset(&q, 0, sizeof q);
        q.hits = calloc(p->nest, sizeof *q.hits);
        q.fail_begin_from = -1;
        int rc = run_probe(&q, p->nest, 3, 4);
        for (size_t i = 0; i < p->nest; i++)
            expect(q.hits[i] == 1, "nested call: every item once", i, (size_t)q.hits[i]);
        expect(rc == 0 && q.begins == 1 && q.ends == 1, "nested call: on its own thread",
               (size_t)q.begins, (size_t)q.ends);
        free(q.hits);
    }
    return (begin / (end - begin + 1)) % 2 ? p->run_status : 0;
}

static probe *new_probe(size_t n)
{
    probe *p = calloc(1, sizeof *p);
    p->hits = calloc(n ? n : 1, sizeof *p->hits);
    p->fail_begin_from = -1;
    return p;
}

static void free_probe(probe *p)
{
    free(p->hits);
    free(p);
}

/* Every item exactly once, begins and ends paired and serialized. */
static void test_items_once(void)
{
    size_t sizes[] = {0, 1, 2, 7, 64, 1000, 4097};
    size_t chunks[] = {1, 3, 64, 5000};
    size_t threads[] = {1, 2, 3, 8, LN_MAX_THREADS + 10};
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t b = 0; b < sizeof chunks / sizeof *chunks; b++)
            for (size_t c = 0; c < sizeof threads / sizeof *threads; c++) {
                size_t n = sizes[a];
                probe *p = new_probe(n);
                int rc = run_probe(p, n, chunks[b], threads[c]);
                expect(rc == 0, "status 0", n, threads[c]);
                for (size_t i = 0; i < n; i++)
                    expect(p->hits[i] == 1, "every item exactly once", i, (size_t)p->hits[i]);
                expect(p->begins == p->ends && p->begins >= 1, "begins == ends",
                       (size_t)p->begins, (size_t)p->ends);
                expect((size_t)p->begins <= threads[c] && p->begins <= LN_MAX_THREADS,
                       "no more threads than asked", (size_t)p->begins, threads[c]);
                expect(!p->ends_overlapped, "ends one at a time", n, threads[c]);
                free_probe(p);
            }
}

/* Statuses combine with worse(); a thread whose begin fails takes no chunk
 * and the others still run everything; if the caller's begin fails
 * nothing runs. */
static void test_statuses(void)
{
    probe *p = new_probe(100);
    p->run_status = 5;
    expect(run_probe(p, 100, 10, 4) == 5, "run statuses combined", 0, 0);
    free_probe(p);

    p = new_probe(1000);
    p->fail_begin_from = 1; /* every begin after the first fails */
    int rc = run_probe(p, 1000, 1, 4);
    for (size_t i = 0; i < 1000; i++)
        expect(p->hits[i] == 1, "failed begins: the others run every item", i,
               (size_t)p->hits[i]);
    expect(p->ends == 1, "failed begins get no end", (size_t)p->ends, 0);
    expect(rc == 0 || rc == 7, "failed begins' status", (size_t)rc, 0);
    free_probe(p);

    p = new_probe(10);
    p->fail_begin_from = 0;
    rc = run_probe(p, 10, 1, 1);
    expect(rc == 7, "caller's begin fails: its status", (size_t)rc, 0);
    for (size_t i = 0; i < 10; i++)
        expect(p->hits[i] == 0, "caller's begin fails: nothing runs", i, (size_t)p->hits[i]);
    free_probe(p);
}

static void test_nested(void)
{
    probe *p = new_probe(40);
    p->nest = 17;
    expect(run_probe(p, 40, 4, 3) == 0, "nested: status", 0, 0);
    for (size_t i = 0; i < 40; i++)
        expect(p->hits[i] == 1, "nested: outer items once", i, (size_t)p->hits[i]);
    free_probe(p);
}

/* Several callers at once: each gets all of its items exactly once. */
static void *caller(void *arg)
{
    (void)arg;
    for (int rep = 0; rep < 50; rep++) {
        probe *p = new_probe(513);
        run_probe(p, 513, 7, 4);
        for (size_t i = 0; i < 513; i++)
            expect(p->hits[i] == 1, "concurrent callers: every item once", i,
                   (size_t)p->hits[i]);
        free_probe(p);
    }
    return NULL;
}

static void test_concurrent_callers(void)
{
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, caller, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
}

int main(void)
{
    test_items_once();
    test_statuses();
    test_nested();
    test_concurrent_callers();
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
