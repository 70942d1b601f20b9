/* cpu_features.c - cpuid + xgetbv feature detection (no SIGILL probing). */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)

static unsigned long long read_xcr0(void)
{
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static hd_cpu_features detect(void)
{
    hd_cpu_features f;
    unsigned a, b, c, d, max;
    int osxsave, ymm_ok = 0, zmm_ok = 0, tile_ok = 0;

    memset(&f, 0, sizeof f);
    max = __get_cpuid_max(0, NULL);
    if (max < 1 || !__get_cpuid(1, &a, &b, &c, &d))
        return f;
    osxsave = (c >> 27) & 1;
    if (osxsave) {
        unsigned long long xcr0 = read_xcr0();
        ymm_ok = (xcr0 & 0x6) == 0x6;          /* xmm + ymm state */
        zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0; /* opmask, zmm hi */
        tile_ok = zmm_ok && (xcr0 & 0x60000) == 0x60000; /* XTILECFG, XTILEDATA */
    }
    f.fma = ymm_ok && ((c >> 12) & 1);
    f.f16c = ymm_ok && ((c >> 29) & 1);
    if (max >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f.avx2 = ymm_ok && ((b >> 5) & 1);
        f.avx512f = zmm_ok && ((b >> 16) & 1);
        f.avx512bw = zmm_ok && ((b >> 30) & 1);
        f.avx512vl = zmm_ok && ((b >> 31) & 1);
        f.avx512vnni = zmm_ok && ((c >> 11) & 1);
        f.amx_bf16 = tile_ok && ((d >> 22) & 1) && ((d >> 24) & 1); /* AMX-BF16, -TILE */
        __cpuid_count(7, 1, a, b, c, d);
        f.avxvnni = ymm_ok && ((a >> 4) & 1);
        f.avx512bf16 = zmm_ok && ((a >> 5) & 1);
    }
    return f;
}
#else
static hd_cpu_features detect(void)
{
    hd_cpu_features f;
    memset(&f, 0, sizeof f);
    return f;
}
#endif

hd_cpu_features hd_cpu_detect(void)
{
    /* Cached as one atomic word (bit 31: valid), so that racing first
     * calls are not a data race; every thread computes the same value. */
    static unsigned cached;
    unsigned bits = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
    hd_cpu_features f;
    if (!(bits & 0x80000000u)) {
        f = detect();
        bits = 0x80000000u | f.avx2 | f.fma << 1 | f.f16c << 2 |
               f.avx512f << 3 | f.avx512bw << 4 | f.avx512vl << 5 |
               f.avx512vnni << 6 | f.avxvnni << 7 | f.avx512bf16 << 8 |
               f.amx_bf16 << 9;
        __atomic_store_n(&cached, bits, __ATOMIC_RELEASE);
    }
    memset(&f, 0, sizeof f);
    f.avx2 = bits & 1;
    f.fma = (bits >> 1) & 1;
    f.f16c = (bits >> 2) & 1;
    f.avx512f = (bits >> 3) & 1;
    f.avx512bw = (bits >> 4) & 1;
    f.avx512vl = (bits >> 5) & 1;
    f.avx512vnni = (bits >> 6) & 1;
    f.avxvnni = (bits >> 7) & 1;
    f.avx512bf16 = (bits >> 8) & 1;
    f.amx_bf16 = (bits >> 9) & 1;
    return f;
}

int hd_cpu_amx_enable(void)
{
    /* 0: not asked yet; 1: granted; 2: refused */
    static int state;
    int st = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (st == 0) {
        st = 2;
        if (hd_cpu_detect().amx_bf16) {
#if defined(__linux__) && defined(__x86_64__)
            /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18);
             * asking again after a grant is harmless */
            if (syscall(SYS_arch_prctl, 0x1023, 18) == 0)
                st = 1;
#else
            st = 1; /* no per-process permission to ask for */
#endif
        }
        __atomic_store_n(&state, st, __ATOMIC_RELEASE);
    }
    return st == 1;
}

const char *hd_cpu_describe(hd_cpu_features f, char *buf, unsigned size)
{
    static const char *const names[] = { "avx2", "fma", "f16c", "avx512f",
                                         "avx512bw", "avx512vl", "avx512vnni",
                                         "avxvnni", "avx512bf16", "amx-bf16" };
    const int on[] = { f.avx2, f.fma, f.f16c, f.avx512f, f.avx512bw,
                       f.avx512vl, f.avx512vnni, f.avxvnni,
                       f.avx512bf16, f.amx_bf16 };
    size_t used = 0;
    if (!size)
        return buf;
    buf[0] = 0;
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!on[i])
            continue;
        int n = snprintf(buf + used, size - used, "%s%s", used ? " " : "", names[i]);
        if (n < 0 || (size_t)n >= size - used)
            break;
        used += (size_t)n;
    }
    if (!used)
        snprintf(buf, size, "baseline");
    return buf;
}
