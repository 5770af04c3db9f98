/*
 * table_test.c - ln_kernels_missing finds a hole in a kernel table
 * (tests/test_pool.py compiles and runs it; the module applies the check
 * to every real table at import).
 */
#include <stdio.h>

#include "layernorm.h"

static int kernel(const ln_rows *rows)
{
    (void)rows;
    return LN_OK;
}

static void fence(void) {}

int main(void)
{
    int failures = 0;
    ln_kernels k = {.name = "test", .store_fence = fence};
    for (int o = 0; o < LN_NOPS; o++)
        for (int t = 0; t < LN_NDTYPES; t++)
            k.op[o][t] = kernel;
    int op, dtype;
    if (ln_kernels_missing(&k, &op, &dtype)) {
        printf("FAIL: a complete table reported incomplete\n");
        failures++;
    }
    for (int o = 0; o < LN_NOPS; o++)
        for (int t = 0; t < LN_NDTYPES; t++) {
            k.op[o][t] = NULL;
            if (!ln_kernels_missing(&k, &op, &dtype) || op != o || dtype != t) {
                printf("FAIL: the hole at (%d, %d) not found\n", o, t);
                failures++;
            }
            k.op[o][t] = kernel;
        }
    k.store_fence = NULL;
    if (!ln_kernels_missing(&k, &op, &dtype) || dtype != -1) {
        printf("FAIL: a missing store_fence not found\n");
        failures++;
    }
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    return failures != 0;
}
