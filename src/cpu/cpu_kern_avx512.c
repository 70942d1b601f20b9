/* cpu_kern_avx512.c - AVX-512 (F, BW, VL) kernels; built with -mavx512f
 * -mavx512bw -mavx512vl -mavx2 -mfma into their own convenience library,
 * called only after cpuid/xgetbv said the CPU has them and the OS saves the
 * zmm and opmask state.
 *
 * The int4 GEMV.  The two 16-entry tables of a tile (column A, column B) of
 * exact bf16 weights bf((v - z) * s) fill one zmm as 32 words, so vpermw
 * turns 32 indices (column * 16 + nibble) into 32 exact weights in one
 * instruction; the weights are widened to fp32 (even words shifted up, odd
 * words masked) and multiplied with x (fp32) in 16-wide FMAs.  The tiles
 * and x are those of the AVX2 kernel (cpu.h, cpu_prepare_x): the nibbles
 * are put in x's order by one vpermw per 32 bytes.  The other kernels are
 * the generic ones at 16 floats per vector. */
#include "config.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef HD_HAVE_SLEEF
#include <sleef.h>
#endif

#include "cpu.h"
#include "cpu_kern_avx512.h"
#include "util.h"

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

#define GVW 16
#include "cpu_kern_generic.h"

/* Word w of the permuted nibble bytes: column c = (w >> 3) & 1 and input
 * k = 2 (d & 3) + (d >> 3) + 8 (w & 1), d = w >> 1, i.e. byte 16 c + k of
 * the 32-byte chunk; so that the even words of the looked-up weights meet
 * x's first 16 floats of the chunk's 8 inputs and the odd words its next
 * 16 (x per 8 inputs: [x0 x2 x4 x6] twice, then [x1 x3 x5 x7] twice,
 * column A in dwords 0..3 and 8..11, column B in 4..7 and 12..15). */
#define PERM_W(w) (16 * (((w) >> 3) & 1) + 2 * (((w) >> 1) & 3) + ((w) >> 4) + \
                   8 * ((w) & 1))

/* One 32-byte chunk of a tile (2 columns x 32 inputs): the bytes widened
 * to words and put in x's order, the low and the high nibbles (+ 16 for
 * column B) looked up in T, widened to fp32, FMA with x. */
static inline void chunk(const uint8_t *t, __m512i T, const float *xi,
                         __m512 *a0, __m512 *a1, __m512 *a2, __m512 *a3)
{
    const __m512i perm = _mm512_set_epi16(
        PERM_W(31), PERM_W(30), PERM_W(29), PERM_W(28), PERM_W(27), PERM_W(26),
        PERM_W(25), PERM_W(24), PERM_W(23), PERM_W(22), PERM_W(21), PERM_W(20),
        PERM_W(19), PERM_W(18), PERM_W(17), PERM_W(16), PERM_W(15), PERM_W(14),
        PERM_W(13), PERM_W(12), PERM_W(11), PERM_W(10), PERM_W(9), PERM_W(8),
        PERM_W(7), PERM_W(6), PERM_W(5), PERM_W(4), PERM_W(3), PERM_W(2),
        PERM_W(1), PERM_W(0));
    /* 16 in the words of column B: words 8..15 and 24..31 */
    const __m512i colb = _mm512_set_epi64(
        0x0010001000100010LL, 0x0010001000100010LL, 0, 0,
        0x0010001000100010LL, 0x0010001000100010LL, 0, 0);
    const __m512i nib = _mm512_set1_epi16(15);
    const __m512i hm = _mm512_set1_epi32((int)0xffff0000u);
    __m512i z = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const void *)t));
    __m512i p = _mm512_permutexvar_epi16(perm, z);
    /* (p & 15) | colb, and (p >> 4) | colb (p < 256) */
    __m512i L = _mm512_ternarylogic_epi32(p, nib, colb, 0xEA);
    __m512i H = _mm512_or_si512(_mm512_srli_epi16(p, 4), colb);
    __m512i wl = _mm512_permutexvar_epi16(L, T);   /* inputs 0..15 */
    __m512i wh = _mm512_permutexvar_epi16(H, T);   /* 16..31 */
#define EVEN(w) _mm512_castsi512_ps(_mm512_slli_epi32(w, 16))
#define ODD(w) _mm512_castsi512_ps(_mm512_and_si512(w, hm))
    *a0 = _mm512_fmadd_ps(EVEN(wl), _mm512_loadu_ps(xi + 0), *a0);
    *a1 = _mm512_fmadd_ps(ODD(wl), _mm512_loadu_ps(xi + 16), *a1);
    *a2 = _mm512_fmadd_ps(EVEN(wh), _mm512_loadu_ps(xi + 32), *a2);
    *a3 = _mm512_fmadd_ps(ODD(wh), _mm512_loadu_ps(xi + 48), *a3);
#undef EVEN
#undef ODD
}

/* y[0] = the dwords of column A (0..3, 8..11), y[1] those of column B. */
static inline void store_pair(float *y, __m512 a)
{
    y[0] = _mm512_mask_reduce_add_ps(0x0f0f, a);
    y[1] = _mm512_mask_reduce_add_ps(0xf0f0, a);
}

/* Columns of pairs [p0, p1), two pairs per pass (each x load feeds two
 * FMAs), four accumulators per pair. */
static void avx512_gemv_pairs(const uint8_t *tiles, int p0, int p1, int groups,
                              const float *xd, float *y)
{
    const size_t ps = (size_t)groups * CPU_TILE_BYTES;
    int p = p0;
    for (; p + 2 <= p1; p += 2) {
        const uint8_t *ta = tiles + (size_t)p * ps, *tb = ta + ps;
        const char *pf = (const char *)ta + PF_AHEAD;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
        __m512 b2 = _mm512_setzero_ps(), b3 = _mm512_setzero_ps();
        for (int g = 0; g < groups; g++) {
            const uint8_t *t = ta + (size_t)g * CPU_TILE_BYTES;
            const uint8_t *u = tb + (size_t)g * CPU_TILE_BYTES;
            const float *xg = xd + (size_t)g * 2 * CPU_GROUP;
            __m512i Ta, Tb;
            pf = pf_pass_step(pf);
            Ta = tile_table(t);
            Tb = tile_table(u);
            for (int i = 0; i < 4; i++) {
                chunk(t + 32 * i, Ta, xg + 64 * i, &a0, &a1, &a2, &a3);
                chunk(u + 32 * i, Tb, xg + 64 * i, &b0, &b1, &b2, &b3);
            }
        }
        store_pair(y + 2 * p, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
        store_pair(y + 2 * p + 2, _mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3)));
    }
    if (p < p1) {
        const uint8_t *ta = tiles + (size_t)p * ps;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        for (int g = 0; g < groups; g++) {
            const uint8_t *t = ta + (size_t)g * CPU_TILE_BYTES;
            const float *xg = xd + (size_t)g * 2 * CPU_GROUP;
            __m512i T;
            pf_tail_step(t);
            T = tile_table(t);
            for (int i = 0; i < 4; i++)
                chunk(t + 32 * i, T, xg + 64 * i, &a0, &a1, &a2, &a3);
        }
        store_pair(y + 2 * p, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
}

/* 16 bf16 words as fp32 (exact) */
static inline __m512 load_bf16x16(const uint16_t *w)
{
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)w)), 16));
}

/* p's two halves as doubles (exact) into *lo and *hi */
static inline void add_halves_f64(__m512 p, __m512d *lo, __m512d *hi)
{
    *lo = _mm512_add_pd(*lo, _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
    *hi = _mm512_add_pd(*hi, _mm512_cvtps_pd(_mm256_castpd_ps(
                                 _mm512_extractf64x4_pd(_mm512_castps_pd(p), 1))));
}

/* gen_dot_bf16_f64 on AVX-512, with the same result (cpu_kern_generic.h
 * says why the order of the additions does not matter): 32 products a
 * pass, each half of 8 converted to doubles and added into one of four
 * accumulators.  GCC kept the generic version's accumulators, each two
 * registers wide, in memory (a store and a load on every add).  One
 * thread, the router's 256 rows of 2304: 52 against 77-79 us hot in L2,
 * but 115-118 against 107-108 us with the rows cold (600 copies), for
 * reasons not found; in whole steps (E 256, context 4096, 2 threads,
 * perf over 1500 steps) the dot products' samples fell from 3.2 to 2.7 %
 * of the GEMVs'. */
static double avx512_dot_bf16_f64(const float *x, const uint16_t *w, int n)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        /* exact: bf16 times bf16 */
        const __m512 p0 = _mm512_mul_ps(_mm512_loadu_ps(x + i), load_bf16x16(w + i));
        const __m512 p1 = _mm512_mul_ps(_mm512_loadu_ps(x + i + 16), load_bf16x16(w + i + 16));
        _mm_prefetch((const char *)(w + i + 1024), _MM_HINT_T0);
        add_halves_f64(p0, &a0, &a1);
        add_halves_f64(p1, &a2, &a3);
    }
    /* the last n % 32 by the generic loops (exact sums: any split adds up
     * to the same bits) */
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3))) +
           gen_dot_bf16_f64(x + i, w + i, n - i);
}

const cpu_kernels cpu_kernels_avx512 = {
    .name = "avx512",
    .layout = CPU_LAYOUT_PAIRED,
    .gemv_pairs = avx512_gemv_pairs,
    .absorb = gen_absorb,
    .vexp = isa_vexp,
    .vsincos = isa_vsincos,
    .dot_bf16_f64 = avx512_dot_bf16_f64,
    .kda_head = gen_kda_head,
    .mla_range = gen_mla_range,
};

#ifdef HD_CPU_HAVE_AVX512BF16
/* The AVX-512 kernels, with the GEMVs of cpu_kern_avx512bf16.c: from x's
 * bf16 words (vdpbf16ps) where x is exactly bf16, else from its floats in
 * the xe layout (the expert down inputs, W_v's); avx512_gemv_pairs only
 * where a vector has no xe (cpu_gemv_pairs). */
const cpu_kernels cpu_kernels_avx512bf16 = {
    .name = "avx512bf16",
    .layout = CPU_LAYOUT_SLICED,
    .gemv_pairs = cpu_avx512bf16_gemv_pairs_xd,
    .gemv_pairs_bf16 = cpu_avx512bf16_gemv_pairs,
    .gemv_pairs_f32 = cpu_avx512bf16_gemv_pairs_f32,
    .absorb = gen_absorb,
    .vexp = isa_vexp,
    .vsincos = isa_vsincos,
    .dot_bf16_f64 = avx512_dot_bf16_f64,
    .kda_head = gen_kda_head,
    .mla_range = gen_mla_range,
};
#endif

#ifdef HD_CPU_HAVE_AMX
/* ---- The MLA attention with its multiply-adds on the tile unit ----
 *
 * The same partials as gen_mla_range (per head the running maximum m, the
 * sum l of exp(score - m) and acc = sum exp(score - m) c_kv), a chunk of
 * AM_T tokens at a time, with the two dot products on the tile unit
 * (cpu_amx_mla_scores_steps, cpu_amx_mla_values_steps, called a step at
 * a time among the vector work: amx_mla_range): the scores as c_kv rows (A
 * tiles straight from the cache) times the absorbed query (B tiles made
 * once a call), the values as p (A tiles) times the chunk's c_kv rows
 * interleaved by token pairs (B tiles).  The fp32 query and p go in as
 * three bf16 parts each, hi + mid + lo, which hold them exactly (as x in
 * cpu_prepare_x's split3), the cache rows are bf16 already, so every
 * product is exact and only the order of the fp32 additions differs from
 * gen_mla_range.  A range of fewer than AM_MIN tokens goes to
 * gen_mla_range.  The tile unit reads subnormal inputs as zero: a call
 * whose query has a non-finite value or a part that is not exact goes to
 * gen_mla_range whole; a part of p below 2^-126 is dropped, an error below
 * 2^-126 times the row's values against a sum of weights of at least 1
 * (the largest p of a head is exp(0)).  The softmax is gen_mla_range's
 * (the maximum with NaN never taken, the rescale, SLEEF's 1-ulp exp, the
 * chunk's sum in double), head by head, 16 tokens a vector, each head's
 * scores gathered from the score tiles' [token][head] rows.
 *
 * Time (one thread, 2048 tokens of the cache hot, in a harness): 0.45 ms
 * against 1.2 ms for gen_mla_range; in a step (E 256, context 4096, two
 * threads) the attention went from about 11 % of the samples to 5 %
 * (docs/PERFORMANCE.md).  The scores are bound by the tile unit: 200
 * TDPBF16PS and 136 tile loads a block of 32 tokens.  With the vector
 * work overlapped (amx_mla_range's pipeline), about 7 % less time hot
 * (eighteenth session). */
#define AM_T 64                         /* tokens a chunk: two blocks */
#define AM_MIN 64                       /* fewer tokens: gen_mla_range */
#define AM_LR HD_MLA_KV_LORA
#define AM_RP HD_MLA_QK_ROPE
#define AM_H HD_MLA_HEADS
/* the work memory, in words from a 64-byte boundary */
#define AM_QT_W ((size_t)CPU_AMX_QT * 512)              /* query B tiles */
#define AM_PT_W ((size_t)12 * 512)                      /* p's A tiles */
#define AM_VT_W ((size_t)2 * 16 * 2 * AM_LR)            /* values' B tiles, a chunk */
#define AM_PAD_W ((size_t)32 * (AM_LR + AM_RP))         /* a partial block */
#define AM_SC_F ((size_t)AM_T * AM_H)                   /* scores, a chunk */
/* two chunks' p and values' tiles (amx_mla_range's pipeline), the
 * scores, the rescale factors, 16 floats for exp */
#define AM_WORK_F ((AM_QT_W + 2 * AM_PT_W + 2 * AM_VT_W + AM_PAD_W) / 2 + AM_SC_F + AM_H + 16 + 16)
_Static_assert(AM_H == 32 && AM_LR % 32 == 0 && AM_RP % 32 == 0,
               "the tile layouts of cpu_amx_mla_scores and _values");
_Static_assert(AM_PT_W + AM_VT_W + AM_PAD_W >= (size_t)3 * AM_H * AM_LR,
               "am_query_tiles' parts fit where p's and the values' tiles go later");

/* bf16 of 16 floats, rounded to nearest even, in the low words of the
 * lanes (hd_f32_to_bf16 without its NaN case: the callers keep NaN
 * apart). */
static inline __m512i am_rne(__m512 v)
{
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd),
                             16);
}

/* The lanes whose bf16 word w is subnormal. */
static inline __mmask16 am_subnormal(__m512i w)
{
    return _mm512_test_epi32_mask(w, _mm512_set1_epi32(0x7fff)) &
           _mm512_testn_epi32_mask(w, _mm512_set1_epi32(0x7f80));
}

/* 16 floats as hi + mid + lo bf16 words (each rounded to nearest even;
 * a NaN as the quiet NaN hi alone), in the low words of the lanes; the
 * lanes where that is exactly v with no part subnormal (the tile unit
 * reads a subnormal as 0) and v is finite.  The subtractions are exact
 * (see cpu_quant.c's split3). */
static inline __mmask16 am_split16(__m512 v, __m512i *hi, __m512i *mid, __m512i *lo)
{
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    *hi = _mm512_mask_mov_epi32(am_rne(v), nan, _mm512_set1_epi32(0x7fc0));
    const __m512 r1 = _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(*hi, 16)));
    *mid = _mm512_maskz_mov_epi32((__mmask16)~nan, am_rne(r1));
    const __m512 r2 = _mm512_sub_ps(r1, _mm512_castsi512_ps(_mm512_slli_epi32(*mid, 16)));
    *lo = _mm512_maskz_mov_epi32((__mmask16)~nan, am_rne(r2));
    const __mmask16 inf = _mm512_cmpeq_epi32_mask(
        _mm512_and_si512(*hi, _mm512_set1_epi32(0x7f80)), _mm512_set1_epi32(0x7f80));
    const __mmask16 exact =
        _mm512_cmp_ps_mask(r2, _mm512_castsi512_ps(_mm512_slli_epi32(*lo, 16)), _CMP_EQ_OQ);
    return exact & (__mmask16)~(inf | am_subnormal(*hi) | am_subnormal(*mid) | am_subnormal(*lo));
}

/* The 32 words of two am_split16 results, lanes of a then of b. */
static inline void am_store_words(uint16_t *dst, __m512i a, __m512i b)
{
    _mm256_store_si256((__m256i *)dst, _mm512_cvtepi32_epi16(a));
    _mm256_store_si256((__m256i *)(dst + 16), _mm512_cvtepi32_epi16(b));
}

/* exp of 16 floats (SLEEF's 1-ulp AVX-512 one where built with SLEEF,
 * else expf through tmp, 16 floats). */
static inline __m512 am_exp16(__m512 v, float *tmp)
{
#ifdef HD_HAVE_SLEEF
    (void)tmp;
    return Sleef_expf16_u10(v);
#else
    _mm512_storeu_ps(tmp, v);
    for (int i = 0; i < 16; i++)
        tmp[i] = expf(tmp[i]);
    return _mm512_loadu_ps(tmp);
#endif
}

/* The query's B tiles: tile (part q, dimension block kt, head half hh),
 * row i, column j = part q of ql of head 16 hh + j at dimensions 32 kt +
 * 2 i and + 1; then the rope's (one part, bf16 already), tile 96 + 2 kt
 * + hh.  tmp: 3 x 32 x AM_LR words.  0 when ql has a value am_split16
 * does not take or qrope one that is not a finite bf16. */
static int am_query_tiles(const float *qlat, const float *qrope, uint16_t *qt, uint16_t *tmp)
{
    __mmask16 ok = 0xffff;
    const size_t pw = (size_t)AM_H * AM_LR;   /* words of a part */
    for (int i = 0; i < AM_H * AM_LR; i += 32) {
        __m512i h0, m0, l0, h1, m1, l1;
        ok &= am_split16(_mm512_loadu_ps(qlat + i), &h0, &m0, &l0);
        ok &= am_split16(_mm512_loadu_ps(qlat + i + 16), &h1, &m1, &l1);
        am_store_words(tmp + i, h0, h1);
        am_store_words(tmp + pw + i, m0, m1);
        am_store_words(tmp + 2 * pw + i, l0, l1);
    }
    for (int i = 0; i < AM_H * AM_RP; i += 16) {
        const __m512i u = _mm512_loadu_si512((const void *)(qrope + i));
        ok &= _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0xffff)) &
              ~_mm512_cmpeq_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7f800000)),
                                       _mm512_set1_epi32(0x7f800000));
    }
    if (ok != 0xffff)
        return 0;
    /* row i of a tile: one 32-bit word (two dimensions) of each of the 16
     * heads, AM_LR / 2 words apart */
    const __m512i heads = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(AM_LR / 2));
    for (int q = 0; q < 3; q++)
        for (int kt = 0; kt < AM_LR / 32; kt++)
            for (int hh = 0; hh < 2; hh++) {
                uint16_t *dst = qt + ((size_t)(q * (AM_LR / 32) + kt) * 2 + hh) * 512;
                const uint16_t *src = tmp + (size_t)q * pw + (size_t)16 * hh * AM_LR + 32 * kt;
                for (int i = 0; i < 16; i++)
                    _mm512_store_si512(dst + 32 * i,
                                       _mm512_i32gather_epi32(heads, (const void *)(src + 2 * i), 4));
            }
    for (int kt = 0; kt < AM_RP / 32; kt++)
        for (int hh = 0; hh < 2; hh++) {
            uint16_t *dst = qt + ((size_t)(3 * (AM_LR / 32) + kt) * 2 + hh) * 512;
            for (int j = 0; j < 16; j++)
                for (int i = 0; i < 32; i++) {
                    uint32_t u;
                    memcpy(&u, &qrope[(16 * hh + j) * AM_RP + 32 * kt + i], 4);
                    dst[32 * (i / 2) + 2 * j + i % 2] = (uint16_t)(u >> 16);
                }
        }
    return 1;
}

/* The values' B tiles of a chunk at vt, units [u0, u1) of its blocks *
 * 256: unit u makes, of block b = u / 256 (its rows at cb[b], AM_LR
 * words apart), tile row i = (u / 16) % 16, which holds tokens 2 i and
 * 2 i + 1 interleaved, dimension by dimension, for the 32 dimensions from
 * 32 (u % 16), in vpunpck{l,h}wd's order: of each 32, the first tile's 16
 * columns are dimensions 0-3, 8-11, 16-19, 24-27, the second's the other
 * 16 (am_unpermute puts acc back in order).  Two one-cycle unpacks where
 * vpermt2w took three uops each (a quarter of this kernel's own time in a
 * profile). */
#define AM_IL_UNITS 256
static void am_interleave_units(const uint16_t *const *cb, uint16_t *vt, int u0, int u1)
{
    for (int u = u0; u < u1; u++) {
        const int b = u / AM_IL_UNITS, i = (u / 16) % 16, d = 32 * (u % 16);
        const uint16_t *r0 = cb[b] + (size_t)(2 * i) * AM_LR + d, *r1 = r0 + AM_LR;
        uint16_t *dst = vt + ((size_t)b * 16 + (size_t)i) * 2 * AM_LR + 2 * d;
        const __m512i x0 = _mm512_loadu_si512((const void *)r0);
        const __m512i x1 = _mm512_loadu_si512((const void *)r1);
        _mm512_store_si512(dst, _mm512_unpacklo_epi16(x0, x1));
        _mm512_store_si512(dst + 32, _mm512_unpackhi_epi16(x0, x1));
    }
}

/* acc's rows from am_interleave's order of the dimensions back to theirs. */
static void am_unpermute(float *acc)
{
    _Alignas(64) int32_t i0[16], i1[16];
    for (int k = 0; k < 32; k++) {  /* dimension k of 32: column of A or 16 + of B */
        const int col = 4 * (k / 8) + k % 4 + (k % 8 < 4 ? 0 : 16);
        (k < 16 ? i0 : i1)[k % 16] = col;
    }
    const __m512i x0 = _mm512_load_si512(i0), x1 = _mm512_load_si512(i1);
    for (int r = 0; r < AM_H; r++)
        for (int d = 0; d < AM_LR; d += 32) {
            float *a = acc + (size_t)r * AM_LR + d;
            const __m512 A = _mm512_loadu_ps(a), B = _mm512_loadu_ps(a + 16);
            _mm512_storeu_ps(a, _mm512_permutex2var_ps(A, x0, B));
            _mm512_storeu_ps(a + 16, _mm512_permutex2var_ps(A, x1, B));
        }
}

/* A chunk of up to AM_T tokens: its tokens, blocks of 32, and in[j], the
 * lanes of vector j (16 tokens) inside its n. */
typedef struct am_chunk {
    int n, blocks;
    __mmask16 in[AM_T / 16];
} am_chunk;

/* The softmax of heads [h0, h1) of chunk ck, its scores at sc ([token]
 * [head] rows): each head's scores gathered, its maximum, exp, the sum,
 * and p's A tile rows in pt; fr[h], the factor by which what was summed
 * before (l[h], rescaled here, and acc's row, by am_rescale) goes to the
 * new maximum, 1 where the maximum stays. */
static void am_softmax_heads(const am_chunk *ck, const float *sc, int h0, int h1, float *m,
                             float *l, float *fr, uint16_t *pt, float *etmp)
{
    const float score_scale = 0.07216878364870322f; /* 192^-0.5 */
    /* the gather of a head's scores from the [token][head] rows */
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(AM_H));
    const __m512 scale = _mm512_set1_ps(score_scale);
    const int nv = 2 * ck->blocks;      /* vectors of 16 tokens */
    for (int h = h0; h < h1; h++) {
        __m512 v[AM_T / 16], mv = _mm512_set1_ps(m[h]);
        for (int j = 0; j < nv; j++) {
            v[j] = _mm512_mul_ps(_mm512_i32gather_ps(rows, sc + (size_t)16 * j * AM_H + h, 4),
                                 scale);
            /* max_ps gives its second operand where either is NaN, so
             * a NaN never becomes the maximum */
            mv = _mm512_mask_max_ps(mv, ck->in[j], v[j], mv);
        }
        const float mx = _mm512_reduce_max_ps(mv);
        fr[h] = 1.0f;
        if (mx > m[h]) { /* what was summed so far, rescaled (by am_rescale) */
            const float f = expf(m[h] - mx);
            l[h] *= f;
            fr[h] = f;
            m[h] = mx;
        }
        for (int j = 0; j < nv; j++)
            v[j] = am_exp16(_mm512_sub_ps(v[j], _mm512_set1_ps(mx)), etmp);
        __m512d ls = _mm512_setzero_pd();
        for (int j = 0; j < nv; j++) {
            v[j] = _mm512_maskz_mov_ps(ck->in[j], v[j]);
            ls = _mm512_add_pd(ls, _mm512_cvtps_pd(_mm512_castps512_ps256(v[j])));
            ls = _mm512_add_pd(ls, _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v[j]), 1))));
        }
        l[h] += (float)_mm512_reduce_add_pd(ls);
        /* p's A tiles: row h % 16 of tiles (h / 16, block, part) */
        for (int b = 0; b < ck->blocks; b++) {
            uint16_t *dst = pt + ((size_t)(h / 16) * 6 + 3 * b) * 512 + 32 * (h % 16);
            __m512i h0w, m0, l0, h1w, m1, l1;
            (void)am_split16(v[2 * b], &h0w, &m0, &l0);
            (void)am_split16(v[2 * b + 1], &h1w, &m1, &l1);
            am_store_words(dst, h0w, h1w);
            am_store_words(dst + 512, m0, m1);
            am_store_words(dst + 1024, l0, l1);
        }
    }
}

/* acc's rows by the factors fr of am_softmax_heads (1: left alone). */
static void am_rescale(float *acc, const float *fr)
{
    for (int h = 0; h < AM_H; h++) {
        float *ah = acc + h * AM_LR;
        if (fr[h] == 1.0f)
            continue;
        for (int d = 0; d < AM_LR; d += 16)
            _mm512_storeu_ps(ah + d, _mm512_mul_ps(_mm512_loadu_ps(ah + d), _mm512_set1_ps(fr[h])));
    }
}

/* The chunks as a pipeline, so that the tile unit and the vector units
 * work at once: while the tile unit makes chunk i's scores, the vector
 * units interleave chunk i's rows into its values' B tiles (the rows
 * just read, from L1); while the tile unit adds chunk i - 1's values into
 * acc, they do chunk i's softmax, which leaves the rescale of acc (a head
 * whose maximum grew) to after those values.  Two chunks' B tiles and p
 * tiles are kept (vt and pt, by chunk parity).  Every head's maximum,
 * rescale, sum and values are taken in the order of the chunks, as one
 * stage after another took them: the same bits.  (One stage after
 * another, the vector work was about a third of the attention's time
 * with the tile unit idle: docs/PERFORMANCE.md, eighteenth session.) */
static void amx_mla_range(const uint16_t *c_kv, const uint16_t *k_rope, size_t t0, size_t t1,
                          const float *qlat, const float *qrope, float *m, float *l, float *acc,
                          float *work)
{
    uint16_t *qt = (uint16_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
    uint16_t *pt[2], *vt[2], *pad;
    float *sc, *fr, *etmp;
    am_chunk prev;
    int have = 0, cur = 0;

    pt[0] = qt + AM_QT_W;
    vt[0] = pt[0] + AM_PT_W;
    vt[1] = vt[0] + AM_VT_W;
    pad = vt[1] + AM_VT_W;
    pt[1] = pad + AM_PAD_W;
    sc = (float *)(pt[1] + AM_PT_W);
    fr = sc + AM_SC_F;
    etmp = fr + AM_H;
    /* a short range: the query's tiles (about 20 us) would cost more than
     * the tile unit saves (`hd-bench --mla --threads 1`: 19.7 against 3.9 us
     * for one token, 31.7 against 34.7 for 64) */
    if (t1 - t0 < AM_MIN || !am_query_tiles(qlat, qrope, qt, pt[0])) {
        gen_mla_range(c_kv, k_rope, t0, t1, qlat, qrope, m, l, acc, work);
        return;
    }
    for (int h = 0; h < AM_H; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    memset(acc, 0, (size_t)AM_H * AM_LR * sizeof(float));
    memset(&prev, 0, sizeof prev);
    cpu_amx_mla_begin();
    for (size_t t = t0; t < t1; t += AM_T) {
        am_chunk ck;
        const uint16_t *cb[AM_T / 32];
        ck.n = t1 - t < AM_T ? (int)(t1 - t) : AM_T;
        ck.blocks = (ck.n + 31) / 32;
        for (int j = 0; j < 2 * ck.blocks; j++)
            ck.in[j] = ck.n - 16 * j >= 16 ? 0xffff
                       : ck.n - 16 * j <= 0 ? 0 : (__mmask16)((1u << (ck.n - 16 * j)) - 1);
        /* stage 1: this chunk's scores; its values' B tiles */
        for (int b = 0; b < ck.blocks; b++) {
            const size_t r0 = t + 32 * (size_t)b;
            const int nb = ck.n - 32 * b < 32 ? ck.n - 32 * b : 32;
            const uint16_t *c = c_kv + r0 * AM_LR, *kr = k_rope + r0 * AM_RP;
            const uint16_t *pfc = NULL, *pfk = NULL;
            if (nb < 32) { /* the block's rows, then zeros */
                memcpy(pad, c, (size_t)nb * AM_LR * 2);
                memset(pad + (size_t)nb * AM_LR, 0, (size_t)(32 - nb) * AM_LR * 2);
                memcpy(pad + 32 * AM_LR, kr, (size_t)nb * AM_RP * 2);
                memset(pad + 32 * AM_LR + (size_t)nb * AM_RP, 0, (size_t)(32 - nb) * AM_RP * 2);
                c = pad;
                kr = pad + 32 * AM_LR;
            } else if (r0 + 64 <= t1) {
                pfc = c + 32 * AM_LR;
                pfk = kr + 32 * AM_RP;
            }
            cb[b] = c;
            for (int s = 0; s < CPU_AMX_SC_STEPS; s++) {
                cpu_amx_mla_scores_steps(c, kr, qt, sc + (size_t)b * 32 * AM_H, pfc, pfk, s,
                                         s + 1);
                am_interleave_units(cb, vt[cur], b * AM_IL_UNITS + AM_IL_UNITS * s / CPU_AMX_SC_STEPS,
                                    b * AM_IL_UNITS + AM_IL_UNITS * (s + 1) / CPU_AMX_SC_STEPS);
            }
        }
        /* stage 2: the values of the chunk before; this chunk's softmax */
        for (int k = 0; k < CPU_AMX_VAL_STEPS; k++) {
            if (have)
                cpu_amx_mla_values_steps(pt[cur ^ 1], vt[cur ^ 1], prev.blocks, acc, k, k + 1);
            am_softmax_heads(&ck, sc, AM_H * k / CPU_AMX_VAL_STEPS,
                             AM_H * (k + 1) / CPU_AMX_VAL_STEPS, m, l, fr, pt[cur], etmp);
        }
        am_rescale(acc, fr);
        prev = ck;
        have = 1;
        cur ^= 1;
    }
    /* the last chunk's values */
    cpu_amx_mla_values_steps(pt[cur ^ 1], vt[cur ^ 1], prev.blocks, acc, 0, CPU_AMX_VAL_STEPS);
    cpu_amx_mla_end();
    am_unpermute(acc);
}

/* The avx512bf16 kernels, with the GEMVs of cpu_kern_amx.c on the AMX tile
 * unit: from x's bf16 words, or from its three bf16 parts where x is fp32
 * (the expert down inputs, W_v's); the avx512bf16 GEMVs for the rest. */
const cpu_kernels cpu_kernels_amx = {
    .name = "amx",
    .layout = CPU_LAYOUT_BLOCKED,
    .gemv_pairs = cpu_avx512bf16_gemv_pairs_xd_blk,
    .gemv_pairs_bf16 = cpu_avx512bf16_gemv_pairs_blk,
    .gemv_pairs_x1 = cpu_amx_gemv_pairs_x1,
    .gemv_pairs_f32 = cpu_avx512bf16_gemv_pairs_f32_blk,
    .gemv_pairs_x3 = cpu_amx_gemv_pairs_x3,
    .absorb = gen_absorb,
    .vexp = isa_vexp,
    .vsincos = isa_vsincos,
    .dot_bf16_f64 = avx512_dot_bf16_f64,
    .kda_head = gen_kda_head,
    .mla_range = amx_mla_range,
    .mla_work = AM_WORK_F,
};
#endif
