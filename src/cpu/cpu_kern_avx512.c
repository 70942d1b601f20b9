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

const cpu_kernels cpu_kernels_avx512 = {
    .name = "avx512",
    .layout = CPU_LAYOUT_PAIRED,
    .gemv_pairs = avx512_gemv_pairs,
    .absorb = gen_absorb,
    .vexp = isa_vexp,
    .vsincos = isa_vsincos,
    .dot_bf16_f64 = gen_dot_bf16_f64,
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
    .dot_bf16_f64 = gen_dot_bf16_f64,
    .kda_head = gen_kda_head,
    .mla_range = gen_mla_range,
};
#endif

#ifdef HD_CPU_HAVE_AMX
/* The avx512bf16 kernels, with the GEMVs of cpu_kern_amx.c on the AMX tile
 * unit: from x's bf16 words, or from its three bf16 parts where x is fp32
 * (the expert down inputs, W_v's); the avx512bf16 GEMVs for the rest. */
const cpu_kernels cpu_kernels_amx = {
    .name = "amx",
    .layout = CPU_LAYOUT_SLICED,
    .gemv_pairs = cpu_avx512bf16_gemv_pairs_xd,
    .gemv_pairs_bf16 = cpu_avx512bf16_gemv_pairs,
    .gemv_pairs_x1 = cpu_amx_gemv_pairs_x1,
    .gemv_pairs_f32 = cpu_avx512bf16_gemv_pairs_f32,
    .gemv_pairs_x3 = cpu_amx_gemv_pairs_x3,
    .absorb = gen_absorb,
    .vexp = isa_vexp,
    .vsincos = isa_vsincos,
    .dot_bf16_f64 = gen_dot_bf16_f64,
    .kda_head = gen_kda_head,
    .mla_range = gen_mla_range,
};
#endif
