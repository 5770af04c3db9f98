/*
 * ln_dispatch.c - choose the kernels at run time from what the CPU can do.
 * The default build never assumes more than the baseline ISA; the AVX2 and
 * AVX-512 kernels are compiled with per-function target attributes.
 */
#include <string.h>

#include "layernorm.h"

static const char *const isa_names[] = {"scalar", "avx2", "avx512"};

int ln_isa_supported(ln_isa isa)
{
    switch (isa) {
    case LN_ISA_SCALAR:
        return 1;
#if defined(LN_HAVE_X86_KERNELS)
    /* The AVX2 kernels also use FMA, and F16C, which every CPU with AVX2
     * has. */
    case LN_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case LN_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f");
#endif
    default:
        return 0;
    }
}

ln_isa ln_isa_best(void)
{
    if (ln_isa_supported(LN_ISA_AVX512))
        return LN_ISA_AVX512;
    if (ln_isa_supported(LN_ISA_AVX2))
        return LN_ISA_AVX2;
    return LN_ISA_SCALAR;
}

const ln_kernels *ln_kernels_for(ln_isa isa)
{
    switch (isa) {
#if defined(LN_HAVE_X86_KERNELS)
    case LN_ISA_AVX2:
        return &ln_kernels_avx2;
    case LN_ISA_AVX512:
        return &ln_kernels_avx512;
#endif
    default:
        return &ln_kernels_scalar;
    }
}

const char *ln_isa_name(ln_isa isa)
{
    if ((int)isa < 0 || (int)isa > (int)LN_ISA_AVX512)
        return "unknown";
    return isa_names[isa];
}

int ln_isa_from_name(const char *name, ln_isa *isa)
{
    for (int i = 0; i <= (int)LN_ISA_AVX512; i++) {
        if (strcmp(name, isa_names[i]) == 0) {
            *isa = (ln_isa)i;
            return 0;
        }
    }
    return -1;
}
