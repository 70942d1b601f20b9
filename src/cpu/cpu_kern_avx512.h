/* cpu_kern_avx512.h - what the AVX-512 kernels (cpu_kern_avx512.c) and the
 * AVX512_BF16 kernel (cpu_kern_avx512bf16.c) share: a tile's table of exact
 * bf16 weights.  Include only where AVX-512 F/BW is enabled. */
#ifndef HD_CPU_KERN_AVX512_H
#define HD_CPU_KERN_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"

/* Prefetch distances: those of the AVX2 kernel (cpu_kern_avx2.c).  A pass
 * over two pairs prefetches the bytes PF_AHEAD past its start, linearly
 * (pf_pass_step, once per group: the pass covers 2 * CPU_TILE_BYTES a
 * group); the one-pair tail prefetches PF_BYTES ahead along its stream
 * (pf_tail_step). */
#define PF_AHEAD 4096
#define PF_BYTES 1024

/* Always inlined, and this matters: GCC 12 finds a function whose only
 * effects are prefetches "const" (prefetches are not side effects to its
 * pure-const analysis), and a chain of const calls whose last result is
 * unused is dead code.  Left to the late inliner, pf_pass_step's calls
 * were deleted: the step of commit f0ff367 lost the pass's prefetches,
 * and the avx512bf16 GEMV took 2.2-3.1 x a plain read instead of
 * 1.03-1.2 x (docs/PERFORMANCE.md, fifth session).  Inlined early, the
 * prefetches are ordinary statements of the caller and stay. */
static inline __attribute__((always_inline)) const char *pf_pass_step(const char *pf)
{
    _mm_prefetch(pf, _MM_HINT_T0);
    _mm_prefetch(pf + 64, _MM_HINT_T0);
    _mm_prefetch(pf + 128, _MM_HINT_T0);
    _mm_prefetch(pf + 192, _MM_HINT_T0);
    _mm_prefetch(pf + 256, _MM_HINT_T0);
    return pf + 2 * CPU_TILE_BYTES;
}

static inline __attribute__((always_inline)) void pf_tail_step(const uint8_t *t)
{
    _mm_prefetch((const char *)(t + PF_BYTES), _MM_HINT_T0);
    _mm_prefetch((const char *)(t + PF_BYTES + 72), _MM_HINT_T0);
}

/* A tile's three cache lines (136 bytes from t, wherever t is in its
 * line), into L1. */
static inline __attribute__((always_inline)) void pf_tile(const uint8_t *t)
{
    _mm_prefetch((const char *)t, _MM_HINT_T0);
    _mm_prefetch((const char *)t + 64, _MM_HINT_T0);
    _mm_prefetch((const char *)t + CPU_TILE_BYTES - 1, _MM_HINT_T0);
}

/* (v - z) * s rounded to bf16, in the high half of each dword: u + 0x8000,
 * less one on an exact tie whose bit 16 is clear (round to nearest even,
 * as tile_tables of cpu_kern_avx2.c). */
static inline __m512i round_bf16_hi(__m512 v, __m512 zv, __m512 sv)
{
    const __m512i half = _mm512_set1_epi32(0x8000), m17 = _mm512_set1_epi32(0x1ffff);
    __m512i u = _mm512_castps_si512(_mm512_mul_ps(_mm512_sub_ps(v, zv), sv));
    __mmask16 tie = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, m17), half);
    __m512i r = _mm512_add_epi32(u, half);
    return _mm512_mask_sub_epi32(r, tie, r, _mm512_set1_epi32(1));
}

/* The 32-word table of a tile: words 0..15 bf((v - zA) * sA), words 16..31
 * bf((v - zB) * sB), v = 0..15 (fp32 sub, fp32 mul, nearest even). */
static inline __m512i tile_table(const uint8_t *t)
{
    const __m512 v = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                    12, 13, 14, 15);
    /* the high words of the 16 dwords of a, then of b */
    const __m512i hi = _mm512_set_epi16(
        63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
        31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    uint32_t s2, z2;
    __m512i a, b;
    memcpy(&s2, t + CPU_TILE_W, 4);         /* scale A, scale B */
    memcpy(&z2, t + CPU_TILE_W + 4, 4);     /* zero A, zero B */
    a = round_bf16_hi(v, _mm512_castsi512_ps(_mm512_set1_epi32((int)(z2 << 16))),
                      _mm512_castsi512_ps(_mm512_set1_epi32((int)(s2 << 16))));
    b = round_bf16_hi(v, _mm512_castsi512_ps(_mm512_set1_epi32((int)(z2 & 0xffff0000u))),
                      _mm512_castsi512_ps(_mm512_set1_epi32((int)(s2 & 0xffff0000u))));
    return _mm512_permutex2var_epi16(a, hi, b);
}

#endif /* HD_CPU_KERN_AVX512_H */
