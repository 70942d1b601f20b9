/* cpu_kern_avx2.c - AVX2/FMA kernels; built with -mavx2 -mfma into their
 * own convenience library, called only after cpuid said the CPU has them. */
#include "config.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef HD_HAVE_SLEEF
#include <sleef.h>
#endif

#include "cpu.h"

static void isa_vexp(float *dst, const float *src, int n)
{
    int i = 0;
#ifdef HD_HAVE_SLEEF
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, Sleef_expf8_u10(_mm256_loadu_ps(src + i)));
    for (; i < n; i++)
        dst[i] = Sleef_expf_u10(src[i]);
#else
    for (; i < n; i++)
        dst[i] = expf(src[i]);
#endif
}

static void isa_vsincos(const float *a, float *s, float *c, int n)
{
    int i = 0;
#ifdef HD_HAVE_SLEEF
    for (; i + 8 <= n; i += 8) {
        Sleef___m256_2 r = Sleef_sincosf8_u10(_mm256_loadu_ps(a + i));
        _mm256_storeu_ps(s + i, r.x);
        _mm256_storeu_ps(c + i, r.y);
    }
#endif
    for (; i < n; i++) {
        s[i] = sinf(a[i]);
        c[i] = cosf(a[i]);
    }
}

#define GVW 8
#include "cpu_kern_generic.h"

/* Bytes ahead to prefetch along a thread's stream of tiles. */
#define PF_BYTES 1536

/* Columns of pairs [p0, p1).  Per tile: the two columns' 16-entry tables
 * of bf((v - z) * s) (low and high bytes, one column per 128-bit lane),
 * computed like the reference (sub, mul, round to nearest even); then each
 * 32-byte chunk = 2 columns x 32 inputs: nibbles -> vpshufb -> bf16 ->
 * fp32 (bf16 << 16) -> FMA with x. */
static void avx2_gemv_pairs(const uint8_t *tiles, int p0, int p1, int groups,
                            const float *xd, float *y)
{
    const __m256i nib = _mm256_set1_epi8(15), zero = _mm256_setzero_si256();
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i m8 = _mm256_set1_epi16(0xff);
    const __m256 v03 = _mm256_setr_ps(0, 1, 2, 3, 0, 1, 2, 3);
    for (int p = p0; p < p1; p++) {
        const uint8_t *tp = tiles + (size_t)p * (size_t)groups * CPU_TILE_BYTES;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (int g = 0; g < groups; g++) {
            const uint8_t *t = tp + (size_t)g * CPU_TILE_BYTES;
            const float *xg = xd + (size_t)g * 2 * CPU_GROUP;
            uint16_t sz[4];
            __m256i r[4], P, Q, TL, TH;
            __m256 sv, zv;
            _mm_prefetch((const char *)(t + PF_BYTES), _MM_HINT_T0);
            _mm_prefetch((const char *)(t + PF_BYTES + 72), _MM_HINT_T0);
            memcpy(sz, t + CPU_TILE_W, sizeof sz);
            sv = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_setr_epi32(
                sz[0], sz[0], sz[0], sz[0], sz[1], sz[1], sz[1], sz[1]), 16));
            zv = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_setr_epi32(
                sz[2], sz[2], sz[2], sz[2], sz[3], sz[3], sz[3], sz[3]), 16));
            for (int m = 0; m < 4; m++) {
                __m256 v = _mm256_add_ps(v03, _mm256_set1_ps((float)(4 * m)));
                __m256i u = _mm256_castps_si256(_mm256_mul_ps(_mm256_sub_ps(v, zv), sv));
                u = _mm256_add_epi32(_mm256_add_epi32(u, bias),
                                     _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
                r[m] = _mm256_srli_epi32(u, 16);
            }
            P = _mm256_packus_epi32(r[0], r[1]); /* lane A: v 0..7 | lane B */
            Q = _mm256_packus_epi32(r[2], r[3]); /* v 8..15 */
            TL = _mm256_packus_epi16(_mm256_and_si256(P, m8), _mm256_and_si256(Q, m8));
            TH = _mm256_packus_epi16(_mm256_srli_epi16(P, 8), _mm256_srli_epi16(Q, 8));
            for (int i = 0; i < 4; i++) {
                const float *xi = xg + 64 * i;
                __m256i v = _mm256_loadu_si256((const void *)(t + 32 * i));
                __m256i L = _mm256_and_si256(v, nib);
                __m256i H = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                __m256i lL = _mm256_shuffle_epi8(TL, L), hL = _mm256_shuffle_epi8(TH, L);
                __m256i lH = _mm256_shuffle_epi8(TL, H), hH = _mm256_shuffle_epi8(TH, H);
                __m256i wL0 = _mm256_unpacklo_epi8(lL, hL), wL1 = _mm256_unpackhi_epi8(lL, hL);
                __m256i wH0 = _mm256_unpacklo_epi8(lH, hH), wH1 = _mm256_unpackhi_epi8(lH, hH);
#define F(w, lohi) _mm256_castsi256_ps(_mm256_unpack##lohi##_epi16(zero, w))
                acc0 = _mm256_fmadd_ps(F(wL0, lo), _mm256_loadu_ps(xi + 0), acc0);
                acc1 = _mm256_fmadd_ps(F(wL0, hi), _mm256_loadu_ps(xi + 8), acc1);
                acc0 = _mm256_fmadd_ps(F(wL1, lo), _mm256_loadu_ps(xi + 16), acc0);
                acc1 = _mm256_fmadd_ps(F(wL1, hi), _mm256_loadu_ps(xi + 24), acc1);
                acc0 = _mm256_fmadd_ps(F(wH0, lo), _mm256_loadu_ps(xi + 32), acc0);
                acc1 = _mm256_fmadd_ps(F(wH0, hi), _mm256_loadu_ps(xi + 40), acc1);
                acc0 = _mm256_fmadd_ps(F(wH1, lo), _mm256_loadu_ps(xi + 48), acc0);
                acc1 = _mm256_fmadd_ps(F(wH1, hi), _mm256_loadu_ps(xi + 56), acc1);
#undef F
            }
        }
        {
            __m256 a = _mm256_add_ps(acc0, acc1);
            __m128 lo = _mm256_castps256_ps128(a), hi = _mm256_extractf128_ps(a, 1);
            __m128 pair = _mm_hadd_ps(lo, hi);   /* a0+a1, a2+a3, b0+b1, b2+b3 */
            pair = _mm_hadd_ps(pair, pair);      /* a, b, a, b */
            y[2 * p] = _mm_cvtss_f32(pair);
            y[2 * p + 1] = _mm_cvtss_f32(_mm_shuffle_ps(pair, pair, 1));
        }
    }
}

const cpu_kernels cpu_kernels_avx2 = {
    .name = "avx2",
    .gemv_pairs = avx2_gemv_pairs,
    .absorb = gen_absorb,
    .vexp = isa_vexp,
    .vsincos = isa_vsincos,
    .dot_bf16_f64 = gen_dot_bf16_f64,
    .kda_head = gen_kda_head,
    .mla_range = gen_mla_range,
};
