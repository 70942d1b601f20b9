/* cpu_features.h - what the CPU can run, read once from cpuid/xgetbv. */
#ifndef HD_CPU_FEATURES_H
#define HD_CPU_FEATURES_H

typedef struct hd_cpu_features {
    unsigned avx2 : 1;      /* AVX2 with OS support for the ymm state */
    unsigned fma : 1;
    unsigned f16c : 1;
    unsigned avx512f : 1;   /* with OS support for the zmm/opmask state */
    unsigned avx512bw : 1;
    unsigned avx512vl : 1;
    unsigned avx512vnni : 1;
    unsigned avxvnni : 1;
    unsigned avx512bf16 : 1; /* vdpbf16ps (AVX512_BF16), with the zmm state */
    unsigned amx_bf16 : 1;  /* AMX-TILE and AMX-BF16, with XCR0's tile state
                             * (a process must still ask Linux for it:
                             * hd_cpu_amx_enable) */
} hd_cpu_features;

/* The features of this CPU (all zero on other architectures).  Cached;
 * safe to call from any thread. */
hd_cpu_features hd_cpu_detect(void);

/* 1 when this process may use the AMX tile registers: the CPU has them
 * (amx_bf16) and, on Linux, arch_prctl(ARCH_REQ_XCOMP_PERM) granted the
 * tile data state (Linux 5.16 and later; it fails where a thread's
 * sigaltstack is too small for the larger signal frame).  Asked once,
 * cached; safe from any thread. */
int hd_cpu_amx_enable(void);

/* A short description, e.g. "avx2 fma avx512f ..." or "baseline". */
const char *hd_cpu_describe(hd_cpu_features f, char *buf, unsigned size);

#endif /* HD_CPU_FEATURES_H */
