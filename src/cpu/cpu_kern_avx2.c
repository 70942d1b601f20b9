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

/* Bytes ahead to prefetch.  A two-pair pass reads two streams of one
 * pair's tiles each (a few KB), so the hardware prefetcher sees only short
 * streams; the kernel instead prefetches the memory that follows the pass,
 * linearly, PF_AHEAD bytes ahead (cold, one thread: 1.5x faster than
 * prefetching 1 KB ahead within each stream; 2, 4, 8 and 16 KB tried). */
#define PF_AHEAD 4096
#define PF_BYTES 1024               /* the one-pair tail: along its stream */

/* (v - z) * s rounded to bf16 (in the high half of each dword; the
 * rounding is explained at tile_tables). */
static inline __m256i round_bf16_hi(__m256 v, __m256 zv, __m256 sv)
{
    const __m256i half = _mm256_set1_epi32(0x8000), m17 = _mm256_set1_epi32(0x1ffff);
    __m256i u = _mm256_castps_si256(_mm256_mul_ps(_mm256_sub_ps(v, zv), sv));
    __m256i tie = _mm256_cmpeq_epi32(_mm256_and_si256(u, m17), half);
    return _mm256_add_epi32(_mm256_add_epi32(u, half), tie);
}

/* The two 16-entry tables of one tile (cpu.h): lane A (column A) and lane
 * B hold the low (TL) and high (TH) bytes of bf((v - z) * s), v = 0..15,
 * computed like the reference: fp32 sub, fp32 mul, round to nearest even.
 * The rounding is u + 0x8000, less one on an exact tie whose bit 16 is
 * clear (the same result as u + 0x7fff + bit 16 without the shifts, which
 * compete with the shuffles, this kernel's bottleneck: 8 % faster hot).  Checked against
 * hd_f32_to_bf16 on 6e8 random and tie cases (NaN: any NaN stays NaN). */
static inline void tile_tables(const uint8_t *t, __m256i *TL, __m256i *TH)
{
    /* bf16 word 0 (lane A) or 1 (lane B) -> the high half of every dword */
    const __m256i spread = _mm256_setr_epi8(
        -1, -1, 0, 1, -1, -1, 0, 1, -1, -1, 0, 1, -1, -1, 0, 1,
        -1, -1, 2, 3, -1, -1, 2, 3, -1, -1, 2, 3, -1, -1, 2, 3);
    /* bytes 2 (low) and 3 (high) of the 4 dwords of a lane -> 4 table
     * entries of TL (bytes 0..3 or 4..7) and of TH (8..11 or 12..15) */
    const __m256i pick0 = _mm256_setr_epi8(
        2, 6, 10, 14, -1, -1, -1, -1, 3, 7, 11, 15, -1, -1, -1, -1,
        2, 6, 10, 14, -1, -1, -1, -1, 3, 7, 11, 15, -1, -1, -1, -1);
    const __m256i pick1 = _mm256_setr_epi8(
        -1, -1, -1, -1, 2, 6, 10, 14, -1, -1, -1, -1, 3, 7, 11, 15,
        -1, -1, -1, -1, 2, 6, 10, 14, -1, -1, -1, -1, 3, 7, 11, 15);
    int32_t s2, z2;
    __m256 sv, zv;
    __m256i r0, r1, r2, r3, X, Y;
    memcpy(&s2, t + CPU_TILE_W, 4);         /* scale A, scale B */
    memcpy(&z2, t + CPU_TILE_W + 4, 4);     /* zero A, zero B */
    sv = _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_set1_epi32(s2), spread));
    zv = _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_set1_epi32(z2), spread));
    /* written out: a loop here stays a loop at -O2, through the stack */
    r0 = round_bf16_hi(_mm256_setr_ps(0, 1, 2, 3, 0, 1, 2, 3), zv, sv);
    r1 = round_bf16_hi(_mm256_setr_ps(4, 5, 6, 7, 4, 5, 6, 7), zv, sv);
    r2 = round_bf16_hi(_mm256_setr_ps(8, 9, 10, 11, 8, 9, 10, 11), zv, sv);
    r3 = round_bf16_hi(_mm256_setr_ps(12, 13, 14, 15, 12, 13, 14, 15), zv, sv);
    X = _mm256_or_si256(_mm256_shuffle_epi8(r0, pick0), _mm256_shuffle_epi8(r1, pick1));
    Y = _mm256_or_si256(_mm256_shuffle_epi8(r2, pick0), _mm256_shuffle_epi8(r3, pick1));
    *TL = _mm256_unpacklo_epi64(X, Y);
    *TH = _mm256_unpackhi_epi64(X, Y);
}

/* One 32-byte chunk of a tile (2 columns x 32 inputs): nibbles -> vpshufb
 * (low and high bytes) -> bf16 words -> fp32 (the even words shifted up,
 * the odd ones masked: x is laid out in that order, cpu_prepare_x) -> FMA. */
static inline void chunk(const uint8_t *t, __m256i TL, __m256i TH,
                         const float *xi, __m256 *ae, __m256 *ao)
{
    const __m256i nib = _mm256_set1_epi8(15);
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    __m256i v = _mm256_loadu_si256((const void *)t);
    __m256i L = _mm256_and_si256(v, nib);
    __m256i H = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
    __m256i lL = _mm256_shuffle_epi8(TL, L), hL = _mm256_shuffle_epi8(TH, L);
    __m256i lH = _mm256_shuffle_epi8(TL, H), hH = _mm256_shuffle_epi8(TH, H);
    __m256i w0 = _mm256_unpacklo_epi8(lL, hL);    /* inputs 0..7 of the chunk */
    __m256i w1 = _mm256_unpackhi_epi8(lL, hL);    /* 8..15 */
    __m256i w2 = _mm256_unpacklo_epi8(lH, hH);    /* 16..23 */
    __m256i w3 = _mm256_unpackhi_epi8(lH, hH);    /* 24..31 */
#define EVEN(w) _mm256_castsi256_ps(_mm256_slli_epi32(w, 16))
#define ODD(w) _mm256_castsi256_ps(_mm256_and_si256(w, hm))
    *ae = _mm256_fmadd_ps(EVEN(w0), _mm256_loadu_ps(xi + 0), *ae);
    *ao = _mm256_fmadd_ps(ODD(w0), _mm256_loadu_ps(xi + 8), *ao);
    *ae = _mm256_fmadd_ps(EVEN(w1), _mm256_loadu_ps(xi + 16), *ae);
    *ao = _mm256_fmadd_ps(ODD(w1), _mm256_loadu_ps(xi + 24), *ao);
    *ae = _mm256_fmadd_ps(EVEN(w2), _mm256_loadu_ps(xi + 32), *ae);
    *ao = _mm256_fmadd_ps(ODD(w2), _mm256_loadu_ps(xi + 40), *ao);
    *ae = _mm256_fmadd_ps(EVEN(w3), _mm256_loadu_ps(xi + 48), *ae);
    *ao = _mm256_fmadd_ps(ODD(w3), _mm256_loadu_ps(xi + 56), *ao);
#undef EVEN
#undef ODD
}

static inline void store_pair(float *y, __m256 a)
{
    __m128 lo = _mm256_castps256_ps128(a), hi = _mm256_extractf128_ps(a, 1);
    __m128 pair = _mm_hadd_ps(lo, hi);      /* a0+a1, a2+a3, b0+b1, b2+b3 */
    pair = _mm_hadd_ps(pair, pair);         /* a, b, a, b */
    y[0] = _mm_cvtss_f32(pair);
    y[1] = _mm_cvtss_f32(_mm_shuffle_ps(pair, pair, 1));
}

/* Columns of pairs [p0, p1), two pairs per pass so that every x load feeds
 * two FMAs (about 1.6x the throughput of one pair per pass with the
 * previous tables, measured hot in L2). */
static void avx2_gemv_pairs(const uint8_t *tiles, int p0, int p1, int groups,
                            const float *xd, float *y)
{
    const size_t ps = (size_t)groups * CPU_TILE_BYTES;
    int p = p0;
    for (; p + 2 <= p1; p += 2) {
        const uint8_t *ta = tiles + (size_t)p * ps, *tb = ta + ps;
        const char *pf = (const char *)ta + PF_AHEAD;
        __m256 ae = _mm256_setzero_ps(), ao = _mm256_setzero_ps();
        __m256 be = _mm256_setzero_ps(), bo = _mm256_setzero_ps();
        for (int g = 0; g < groups; g++) {
            const uint8_t *t = ta + (size_t)g * CPU_TILE_BYTES;
            const uint8_t *u = tb + (size_t)g * CPU_TILE_BYTES;
            const float *xg = xd + (size_t)g * 2 * CPU_GROUP;
            __m256i TLa, THa, TLb, THb;
            /* the pass covers 2 * ps bytes in `groups` steps of 272 */
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + 64, _MM_HINT_T0);
            _mm_prefetch(pf + 128, _MM_HINT_T0);
            _mm_prefetch(pf + 192, _MM_HINT_T0);
            _mm_prefetch(pf + 256, _MM_HINT_T0);
            pf += 2 * CPU_TILE_BYTES;
            tile_tables(t, &TLa, &THa);
            tile_tables(u, &TLb, &THb);
            chunk(t, TLa, THa, xg, &ae, &ao);
            chunk(u, TLb, THb, xg, &be, &bo);
            chunk(t + 32, TLa, THa, xg + 64, &ae, &ao);
            chunk(u + 32, TLb, THb, xg + 64, &be, &bo);
            chunk(t + 64, TLa, THa, xg + 128, &ae, &ao);
            chunk(u + 64, TLb, THb, xg + 128, &be, &bo);
            chunk(t + 96, TLa, THa, xg + 192, &ae, &ao);
            chunk(u + 96, TLb, THb, xg + 192, &be, &bo);
        }
        store_pair(y + 2 * p, _mm256_add_ps(ae, ao));
        store_pair(y + 2 * p + 2, _mm256_add_ps(be, bo));
    }
    if (p < p1) {
        const uint8_t *ta = tiles + (size_t)p * ps;
        __m256 ae = _mm256_setzero_ps(), ao = _mm256_setzero_ps();
        for (int g = 0; g < groups; g++) {
            const uint8_t *t = ta + (size_t)g * CPU_TILE_BYTES;
            const float *xg = xd + (size_t)g * 2 * CPU_GROUP;
            __m256i TL, TH;
            _mm_prefetch((const char *)(t + PF_BYTES), _MM_HINT_T0);
            _mm_prefetch((const char *)(t + PF_BYTES + 72), _MM_HINT_T0);
            tile_tables(t, &TL, &TH);
            for (int i = 0; i < 4; i++)
                chunk(t + 32 * i, TL, TH, xg + 64 * i, &ae, &ao);
        }
        store_pair(y + 2 * p, _mm256_add_ps(ae, ao));
    }
}

/* 8 bf16 words as fp32 (exact) */
static inline __m256 load_bf16x8(const uint16_t *w)
{
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)w)), 16));
}

/* p's two halves as doubles (exact) into *lo and *hi */
static inline void add_halves_f64(__m256 p, __m256d *lo, __m256d *hi)
{
    *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
    *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
}

/* gen_dot_bf16_f64 on AVX2, with the same result (cpu_kern_generic.h says
 * why the order of the additions does not matter): 16 products a pass,
 * each half of 8 converted to doubles and added into one of four
 * accumulators.  GCC 12 kept the generic version's accumulators (vectors
 * of 8 doubles, two registers wide) in memory and converted the products
 * two at a time.  One thread, the router's 256 rows of 2304: 80 against
 * 341-360 us hot in L2, 89-95 against 336-340 us with the rows cold (600
 * copies). */
static double avx2_dot_bf16_f64(const float *x, const uint16_t *w, int n)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        /* exact: bf16 times bf16 */
        const __m256 p0 = _mm256_mul_ps(_mm256_loadu_ps(x + i), load_bf16x8(w + i));
        const __m256 p1 = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), load_bf16x8(w + i + 8));
        _mm_prefetch((const char *)(w + i + 1024), _MM_HINT_T0);
        add_halves_f64(p0, &a0, &a1);
        add_halves_f64(p1, &a2, &a3);
    }
    const __m256d a = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    /* the last n % 16 by the generic loops (exact sums: any split adds up
     * to the same bits) */
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h))) +
           gen_dot_bf16_f64(x + i, w + i, n - i);
}

const cpu_kernels cpu_kernels_avx2 = {
    .name = "avx2",
    .layout = CPU_LAYOUT_PAIRED,
    .gemv_pairs = avx2_gemv_pairs,
    .absorb = gen_absorb,
    .vexp = isa_vexp,
    .vsincos = isa_vsincos,
    .dot_bf16_f64 = avx2_dot_bf16_f64,
    .kda_head = gen_kda_head,
    .mla_range = gen_mla_range,
};
