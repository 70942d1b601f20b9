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
} hd_cpu_features;

/* The features of this CPU (all zero on other architectures).  Cached;
 * safe to call from any thread. */
hd_cpu_features hd_cpu_detect(void);

/* A short description, e.g. "avx2 fma avx512f ..." or "baseline". */
const char *hd_cpu_describe(hd_cpu_features f, char *buf, unsigned size);

#endif /* HD_CPU_FEATURES_H */
