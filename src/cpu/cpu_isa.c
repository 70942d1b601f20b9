/* cpu_isa.c - which kernels a model uses: chosen once, at model creation,
 * from cpuid/xgetbv (amx where this CPU, its OS and this build run it,
 * else avx512bf16, else avx2, else avx512, else portable), or forced by
 * HD_CPU_ISA=portable|avx2|avx512|avx512bf16|amx (avx512bf16: the avx512
 * kernels, with the vdpbf16ps GEMV where x is exactly bf16; amx: those,
 * with the GEMVs on the AMX tile unit).  amx comes first: on an Intel Xeon
 * with AMX its GEMVs took about 0.7 of the time of the others, where
 * vdpbf16ps and the table lookups share the vector ports (docs/
 * PERFORMANCE.md).  avx512bf16 next: on
 * Zen 4 its GEMV took 0.6-0.7 of the time of the others (docs/
 * PERFORMANCE.md).  Then avx2: on the same machine the plain avx512
 * kernels were no faster (512-bit operations in two halves), so they are
 * chosen by name until a machine shows them ahead. */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu.h"
#include "cpu_features.h"
#include "util.h"

static int isa_runs(cpu_isa isa)
{
    hd_cpu_features f = hd_cpu_detect();
    switch (isa) {
    case CPU_ISA_PORTABLE:
        return 1;
    case CPU_ISA_AVX2:
#ifdef HD_CPU_HAVE_AVX2
        return f.avx2 && f.fma;
#else
        return 0;
#endif
    case CPU_ISA_AVX512:
#ifdef HD_CPU_HAVE_AVX512
        /* the avx512* bits include XCR0's opmask and zmm state */
        return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma;
#else
        return 0;
#endif
    case CPU_ISA_AVX512BF16:
#ifdef HD_CPU_HAVE_AVX512BF16
        return isa_runs(CPU_ISA_AVX512) && f.avx512bf16;
#else
        return 0;
#endif
    case CPU_ISA_AMX:
#ifdef HD_CPU_HAVE_AMX
        return isa_runs(CPU_ISA_AVX512BF16) && f.amx_bf16 && hd_cpu_amx_enable();
#else
        return 0;
#endif
    }
    return 0;
}

hd_status cpu_choose_isa(cpu_isa *isa, char *err, size_t err_size)
{
    static const char *const names[] = { "portable", "avx2", "avx512", "avx512bf16", "amx" };
    const char *env = getenv("HD_CPU_ISA");
    if (env && *env) {
        for (int i = 0; i < 5; i++) {
            if (strcmp(env, names[i]) != 0)
                continue;
            if (!isa_runs((cpu_isa)i))
                return hd_fail(err, err_size, HD_ERR_BACKEND_UNAVAILABLE,
                               "HD_CPU_ISA=%s: this CPU or this build of libhd "
                               "cannot run the %s kernels", env, names[i]);
            *isa = (cpu_isa)i;
            return HD_OK;
        }
        return hd_fail(err, err_size, HD_ERR_BACKEND_UNAVAILABLE,
                       "HD_CPU_ISA=\"%.32s\" is not one of portable, avx2, avx512, "
                       "avx512bf16, amx",
                       env);
    }
    *isa = isa_runs(CPU_ISA_AMX)        ? CPU_ISA_AMX
         : isa_runs(CPU_ISA_AVX512BF16) ? CPU_ISA_AVX512BF16
         : isa_runs(CPU_ISA_AVX2)       ? CPU_ISA_AVX2
         : isa_runs(CPU_ISA_AVX512)     ? CPU_ISA_AVX512
                                        : CPU_ISA_PORTABLE;
    return HD_OK;
}

const cpu_kernels *cpu_kernels_for(cpu_isa isa)
{
    switch (isa) {
#ifdef HD_CPU_HAVE_AMX
    case CPU_ISA_AMX:
        return &cpu_kernels_amx;
#endif
#ifdef HD_CPU_HAVE_AVX512BF16
    case CPU_ISA_AVX512BF16:
        return &cpu_kernels_avx512bf16;
#endif
#ifdef HD_CPU_HAVE_AVX512
    case CPU_ISA_AVX512:
        return &cpu_kernels_avx512;
#endif
#ifdef HD_CPU_HAVE_AVX2
    case CPU_ISA_AVX2:
        return &cpu_kernels_avx2;
#endif
    default:
        return &cpu_kernels_portable;
    }
}

int cpu_resolve_threads(int requested)
{
    int t = requested;
#ifdef _OPENMP
    if (t <= 0)
        t = omp_get_max_threads();
#else
    t = 1;
#endif
    if (t < 1)
        t = 1;
    if (t > 64)
        t = 64;
    return t;
}
