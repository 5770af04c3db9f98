/*
 * ln_dispatch.c - choose the level at run time from what the CPU can do.
 * The default build never assumes more than the baseline ISA: the x86
 * levels are compiled with target pragmas and used only when the CPU has
 * their features.
 */
#include <string.h>

#include "layernorm.h"

static const char *const isa_names[LN_NISAS] = {
    [LN_ISA_SCALAR] = "scalar",
    [LN_ISA_PORTABLE] = "portable",
    [LN_ISA_AVX2] = "avx2",
    [LN_ISA_AVX512] = "avx512",
};

static const ln_kernels *const isa_kernels[LN_NISAS] = {
    [LN_ISA_SCALAR] = &ln_kernels_scalar,
    [LN_ISA_PORTABLE] = &ln_kernels_portable,
#if defined(LN_HAVE_X86_LEVELS)
    [LN_ISA_AVX2] = &ln_kernels_avx2,
    [LN_ISA_AVX512] = &ln_kernels_avx512,
#endif
};

#if defined(LN_HAVE_X86_LEVELS)
#include <cpuid.h>

/* F16C is CPUID leaf 1, ECX bit 29 (not every compiler's
 * __builtin_cpu_supports knows its name). */
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
}

/* The portable and AVX2 levels are built for AVX2 + FMA + F16C. */
static int has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
}

static int has_avx512(void)
{
    __builtin_cpu_init();
    return has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
}

int ln_cpu_bf16_convert = 0;

/* Read at load time, so that no kernel ever sees it change. */
__attribute__((constructor)) static void detect_bf16_convert(void)
{
    __builtin_cpu_init();
    ln_cpu_bf16_convert = has_avx512() && __builtin_cpu_supports("avx512bf16");
}
#endif

int ln_isa_supported(ln_isa isa)
{
    switch (isa) {
    case LN_ISA_SCALAR:
        return 1;
#if defined(LN_HAVE_X86_LEVELS)
    case LN_ISA_PORTABLE:
    case LN_ISA_AVX2:
        return has_avx2();
    case LN_ISA_AVX512:
        return has_avx512();
#else
    case LN_ISA_PORTABLE:
        return 1;
#endif
    default:
        return 0;
    }
}

ln_isa ln_isa_best(void)
{
    for (int i = LN_NISAS - 1; i > 0; i--)
        if (ln_isa_supported((ln_isa)i))
            return (ln_isa)i;
    return LN_ISA_SCALAR;
}

const ln_kernels *ln_kernels_for(ln_isa isa)
{
    if ((int)isa < 0 || (int)isa >= LN_NISAS || isa_kernels[isa] == NULL)
        return &ln_kernels_scalar;
    return isa_kernels[isa];
}

const char *ln_isa_name(ln_isa isa)
{
    if ((int)isa < 0 || (int)isa >= LN_NISAS)
        return "unknown";
    return isa_names[isa];
}

int ln_isa_from_name(const char *name, ln_isa *isa)
{
    for (int i = 0; i < LN_NISAS; i++) {
        if (strcmp(name, isa_names[i]) == 0) {
            *isa = (ln_isa)i;
            return 0;
        }
    }
    return -1;
}
