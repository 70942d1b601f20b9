/* cpu_kern_avx512bf16.c - the int4 GEMV with AVX512_BF16 (vdpbf16ps), for
 * an x that is exactly bf16 (cpu_xq.bf16), and one with the same tables and
 * fp32 FMAs for any other x (cpu_xq.xe, at the end); built with
 * -mavx512bf16 on top of the AVX-512 flags into its own convenience library, called only
 * after cpuid/xgetbv said the CPU has AVX512_BF16 (cpu_isa.c).
 *
 * Why it is exact.  vpermw looks the nibbles up in the tile's table of
 * exact bf16 weights bf((v - z) * s), as in cpu_kern_avx512.c; those words
 * are already bf16, and so is x: vdpbf16ps multiplies pairs of them (a
 * product of two 8-bit significands fits fp32's 24 bits: exact) and adds
 * the two products to an fp32 lane.  Only the summation order differs from
 * the fp32 FMA kernel.  vdpbf16ps treats subnormal inputs as zero and
 * flushes subnormal results: so an x with a subnormal stays on the fp32
 * kernel (cpu_prepare_x), a tile whose weights could be subnormal goes
 * through fp32 FMAs (cpu_table_normal, tile_ymm), and what is left is a
 * product or partial sum below 2^-126 in magnitude flushed to zero (an
 * absolute error below 1.2e-38 each: nothing a normed x and real scales
 * produce).
 *
 * Why it is faster.  Per 64 weights the fp32 kernel spends ~15 zmm
 * instructions, 6 of them widening bf16 to fp32 (shift, mask) and 4 FMAs;
 * here the looked-up words go straight into 2 vdpbf16ps (two products per
 * lane), and a column's 16 bytes of a chunk, widened, are the inputs in
 * order (low nibbles, then high), so x's bf16 words are read as they are
 * and the vpermw that put the nibbles in x's order goes too.  That made
 * the tile's table (once per 256 weights) half of the time, so the table
 * is built with vcvtne2ps2bf16 (tile_tables_bf16).  Zen 4 runs zmm
 * instructions as two 256-bit halves: the ymm form below (one column per
 * ymm) needs no column bit in the indices. */
#include "config.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"
#include "cpu_kern_avx512.h"

/* The tile's two tables (tile_table's words, column A's in TA, B's in
 * TB) with vcvtne2ps2bf16, which rounds fp32 to bf16 to nearest even in
 * one instruction, as hd_f32_to_bf16 does (NaN quieted alike), but
 * flushes a subnormal fp32 value to zero; so it is used only where no
 * (v - z) * s can be subnormal (cpu_table_normal: per tile, or once per
 * matrix, cpu_qmat.normal).  Built with tile_table (~17 zmm instructions,
 * four of them moves from general registers) the tables were half of the
 * kernel's time, and with vcvtne2ps2bf16 in one zmm still a quarter (with
 * the weights hot); here they are 12 ymm instructions: the ymm form needs
 * no extraction of column B's half, and the two lanes of a zmm cost Zen 4
 * two ymm slots anyway. */
static inline __attribute__((always_inline)) void
tile_tables_bf16(const uint8_t *t, __m256i *TA, __m256i *TB)
{
    const __m256 v0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 v1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    int32_t s2, z2;
    memcpy(&s2, t + CPU_TILE_W, 4);         /* scale A, scale B */
    memcpy(&z2, t + CPU_TILE_W + 4, 4);     /* zero A, zero B */
    const __m256i S = _mm256_set1_epi32(s2), Z = _mm256_set1_epi32(z2);
    const __m256 sa = _mm256_castsi256_ps(_mm256_slli_epi32(S, 16));
    const __m256 za = _mm256_castsi256_ps(_mm256_slli_epi32(Z, 16));
    const __m256 sb = _mm256_castsi256_ps(_mm256_and_si256(S, hm));
    const __m256 zb = _mm256_castsi256_ps(_mm256_and_si256(Z, hm));
    /* words 0..7 from the second operand */
    *TA = (__m256i)_mm256_cvtne2ps_pbh(_mm256_mul_ps(_mm256_sub_ps(v1, za), sa),
                                       _mm256_mul_ps(_mm256_sub_ps(v0, za), sa));
    *TB = (__m256i)_mm256_cvtne2ps_pbh(_mm256_mul_ps(_mm256_sub_ps(v1, zb), sb),
                                       _mm256_mul_ps(_mm256_sub_ps(v0, zb), sb));
}

/* 1 when both columns of tile t pass cpu_table_normal. */
static inline int tile_normal(const uint8_t *t)
{
    uint16_t sz[4];                         /* scale A, B, zero A, B */
    memcpy(sz, t + CPU_TILE_W, 8);
    return cpu_table_normal(sz[0], sz[2]) & cpu_table_normal(sz[1], sz[3]);
}

/* sum += w x over a ymm of weight words and 16 words of x: fp32 FMAs on
 * the even and the odd words widened, the products' pairs in the dwords
 * where vdpbf16ps puts them. */
static inline __m256 fma8(__m256 acc, __m256i w, const uint16_t *x)
{
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    const __m256i xv = _mm256_loadu_si256((const void *)x);
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)),
                          _mm256_castsi256_ps(_mm256_slli_epi32(xv, 16)), acc);
    return _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w, hm)),
                           _mm256_castsi256_ps(_mm256_and_si256(xv, hm)), acc);
}

static inline __m256 dp8(__m256 acc, __m256i w, const uint16_t *x)
{
    return _mm256_dpbf16_ps(acc, (__m256bh)w,
                            (__m256bh)_mm256_loadu_si256((const void *)x));
}

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The four 32-byte chunks of a tile looked up in the columns' tables TA,
 * TB and multiplied with x: by vdpbf16ps on x's bf16 words (dot), or by
 * fp32 FMAs (fma8), which keep subnormal weights.  dot is a constant at
 * every call, so each caller gets one straight loop. */
static inline __attribute__((always_inline)) void
tile_chunks(const uint8_t *t, const uint16_t *xg, __m256i TA, __m256i TB, int dot,
            __m256 *al, __m256 *ah, __m256 *bl, __m256 *bh)
{
    for (int i = 0; i < 4; i++) {
        const uint8_t *c = t + 32 * i;
        const uint16_t *xc = xg + 32 * i;
        __m256i pa = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)c));
        __m256i pb = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)(c + 16)));
        __m256i wal = _mm256_permutexvar_epi16(pa, TA);
        __m256i wah = _mm256_permutexvar_epi16(_mm256_srli_epi16(pa, 4), TA);
        __m256i wbl = _mm256_permutexvar_epi16(pb, TB);
        __m256i wbh = _mm256_permutexvar_epi16(_mm256_srli_epi16(pb, 4), TB);
        if (dot) {
            *al = dp8(*al, wal, xc);
            *ah = dp8(*ah, wah, xc + 16);
            *bl = dp8(*bl, wbl, xc);
            *bh = dp8(*bh, wbh, xc + 16);
        } else {
            *al = fma8(*al, wal, xc);
            *ah = fma8(*ah, wah, xc + 16);
            *bl = fma8(*bl, wbl, xc);
            *bh = fma8(*bh, wbh, xc + 16);
        }
    }
}

/* One tile (2 columns x 128 inputs) onto the accumulators of its columns:
 * per 32-byte chunk, each column's 16 bytes widened to words (byte b: the
 * inputs 32i + b, low nibble, and 32i + 16 + b, high nibble); vpermw on a
 * ymm reads only the low 4 bits of an index, so the widened bytes index
 * the column's 16-entry table as they are, and shifted right by 4 they
 * index the high nibbles: the inputs 32i .. 32i + 15 and the next 16,
 * x's words at 32i and 32i + 16.  The
 * ymm form: per 64 weights 12 ymm instructions (2 widenings, 2 shifts, 4
 * vpermw, 4 vdpbf16ps); the zmm form (both columns in one zmm, a column
 * bit merged into the indices: 8 zmm, i.e. 16 halves on Zen 4) measured
 * the same within the noise of this shared machine. */
static inline __attribute__((always_inline)) void
tile_ymm(const uint8_t *t, const uint16_t *xg, int checked, __m256 *al, __m256 *ah,
         __m256 *bl, __m256 *bh)
{
    __m256i TA, TB;
    /* a tile whose weights may be subnormal (cpu_table_normal): tile_table's
     * exact rounding and fp32 FMAs */
    if (checked && __builtin_expect(!tile_normal(t), 0)) {
        const __m512i T = tile_table(t);
        tile_chunks(t, xg, _mm512_castsi512_si256(T), _mm512_extracti64x4_epi64(T, 1), 0,
                    al, ah, bl, bh);
        return;
    }
    tile_tables_bf16(t, &TA, &TB);
    tile_chunks(t, xg, TA, TB, 1, al, ah, bl, bh);
}

/* Columns of pairs [p0, p1) times x's bf16 words, two pairs per pass;
 * checked (a constant at each call): test every tile with tile_normal.
 * Not checking saves ~13 % of the kernel's time with the weights hot. */
static inline __attribute__((always_inline)) void
gemv_pairs(const uint8_t *tiles, int p0, int p1, int groups, int checked,
           const uint16_t *xb, float *y)
{
    const size_t ps = (size_t)groups * CPU_TILE_BYTES;
    int p = p0;
    for (; p + 2 <= p1; p += 2) {
        const uint8_t *ta = tiles + (size_t)p * ps, *tb = ta + ps;
        const char *pf = (const char *)ta + PF_AHEAD;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
        __m256 b2 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
        for (int g = 0; g < groups; g++) {
            const uint16_t *xg = xb + (size_t)g * CPU_GROUP;
            pf = pf_pass_step(pf);
            tile_ymm(ta + (size_t)g * CPU_TILE_BYTES, xg, checked, &a0, &a1, &a2, &a3);
            tile_ymm(tb + (size_t)g * CPU_TILE_BYTES, xg, checked, &b0, &b1, &b2, &b3);
        }
        y[2 * p] = hsum8(_mm256_add_ps(a0, a1));
        y[2 * p + 1] = hsum8(_mm256_add_ps(a2, a3));
        y[2 * p + 2] = hsum8(_mm256_add_ps(b0, b1));
        y[2 * p + 3] = hsum8(_mm256_add_ps(b2, b3));
    }
    if (p < p1) {
        const uint8_t *ta = tiles + (size_t)p * ps;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int g = 0; g < groups; g++) {
            const uint8_t *t = ta + (size_t)g * CPU_TILE_BYTES;
            pf_tail_step(t);
            tile_ymm(t, xb + (size_t)g * CPU_GROUP, checked, &a0, &a1, &a2, &a3);
        }
        y[2 * p] = hsum8(_mm256_add_ps(a0, a1));
        y[2 * p + 1] = hsum8(_mm256_add_ps(a2, a3));
    }
}

void cpu_avx512bf16_gemv_pairs(const uint8_t *tiles, int p0, int p1,
                               int groups, int normal, const uint16_t *xb, float *y)
{
    if (normal)
        gemv_pairs(tiles, p0, p1, groups, 0, xb, y);
    else
        gemv_pairs(tiles, p0, p1, groups, 1, xb, y);
}

/* ---- fp32 x (cpu_xq.xe) ----
 *
 * The expert down inputs and W_v's are fp32 with 24 significant bits.
 * The weights are looked up as above; each ymm of 16 weight words (16
 * consecutive inputs) is widened to fp32, the even words shifted up and
 * the odd ones masked (exact), and multiplied with x by fp32 FMAs, 8 per
 * 32 bytes of tiles; xe holds x per 16 inputs, the 8 even ones then the 8
 * odd ones, so that both halves meet x as they are.  Nothing is rounded
 * but the sums, as in the avx512 fp32 kernel, and any fp32 x is taken as
 * it is (subnormals, infinities, NaN).  A tile whose weights may be
 * subnormal gets tile_table's exact rounding instead of vcvtne2ps2bf16;
 * the FMAs keep subnormal weights.
 *
 * Measured against the three-part kernel it replaces (x = hi + mid + lo,
 * three vdpbf16ps per weight vector, 12 per 32 bytes, bound by Zen 4's two
 * FMA pipes): 6.40 against 7.12 TSC ticks per 32 bytes hot, 12.5 against
 * 11.1 GB/s cold with one thread, and no split of x (docs/PERFORMANCE.md). */

/* acc_e += the even weights of w times x[0..7], acc_o += the odd ones
 * times x[8..15]. */
static inline __attribute__((always_inline)) void
fma16(__m256 *acc_e, __m256 *acc_o, __m256i w, const float *x)
{
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    *acc_e = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)),
                             _mm256_loadu_ps(x), *acc_e);
    *acc_o = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w, hm)),
                             _mm256_loadu_ps(x + 8), *acc_o);
}

/* The accumulators of one tile column pair: a[0..3] column A (even and
 * odd words of the low nibbles, then of the high ones), a[4..7] column B.
 * Passed and returned by value, so that they stay in registers. */
typedef struct accf {
    __m256 a[8];
} accf;

/* The four chunks of a tile, tables TA and TB, x at xg (xe layout). */
static inline __attribute__((always_inline)) accf
tile_chunks_f32(const uint8_t *t, const float *xg, __m256i TA, __m256i TB, accf a)
{
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const uint8_t *c = t + 32 * i;
        const float *xc = xg + 32 * i;
        __m256i pa = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)c));
        __m256i pb = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)(c + 16)));
        fma16(&a.a[0], &a.a[1], _mm256_permutexvar_epi16(pa, TA), xc);
        fma16(&a.a[2], &a.a[3], _mm256_permutexvar_epi16(_mm256_srli_epi16(pa, 4), TA),
              xc + 16);
        fma16(&a.a[4], &a.a[5], _mm256_permutexvar_epi16(pb, TB), xc);
        fma16(&a.a[6], &a.a[7], _mm256_permutexvar_epi16(_mm256_srli_epi16(pb, 4), TB),
              xc + 16);
    }
    return a;
}

/* A tile whose weights may be subnormal: tile_table's exact words.  Out of
 * line, so that the hot loop's registers do not serve it. */
static __attribute__((noinline, cold)) accf
tile_f32_exact(const uint8_t *t, const float *xg, accf a)
{
    const __m512i T = tile_table(t);
    return tile_chunks_f32(t, xg, _mm512_castsi512_si256(T), _mm512_extracti64x4_epi64(T, 1),
                           a);
}

static inline __attribute__((always_inline)) accf
tile_f32(const uint8_t *t, const float *xg, int checked, accf a)
{
    __m256i TA, TB;
    if (checked && __builtin_expect(!tile_normal(t), 0))
        return tile_f32_exact(t, xg, a);
    tile_tables_bf16(t, &TA, &TB);
    return tile_chunks_f32(t, xg, TA, TB, a);
}

static inline accf accf_zero(void)
{
    accf a;
    for (int i = 0; i < 8; i++)
        a.a[i] = _mm256_setzero_ps();
    return a;
}

/* Column A's sum and column B's. */
static inline void store_pair_f32(float *y, accf a)
{
    y[0] = hsum8(_mm256_add_ps(_mm256_add_ps(a.a[0], a.a[1]), _mm256_add_ps(a.a[2], a.a[3])));
    y[1] = hsum8(_mm256_add_ps(_mm256_add_ps(a.a[4], a.a[5]), _mm256_add_ps(a.a[6], a.a[7])));
}

/* Columns of pairs [p0, p1) times x (xe layout), two pairs per pass;
 * checked as in gemv_pairs. */
static inline __attribute__((always_inline)) void
gemv_pairs_f32(const uint8_t *tiles, int p0, int p1, int groups, int checked,
               const float *xe, float *y)
{
    const size_t ps = (size_t)groups * CPU_TILE_BYTES;
    int p = p0;
    for (; p + 2 <= p1; p += 2) {
        const uint8_t *ta = tiles + (size_t)p * ps, *tb = ta + ps;
        const char *pf = (const char *)ta + PF_AHEAD;
        accf a = accf_zero(), b = accf_zero();
        for (int g = 0; g < groups; g++) {
            const float *xg = xe + (size_t)g * CPU_GROUP;
            pf = pf_pass_step(pf);
            a = tile_f32(ta + (size_t)g * CPU_TILE_BYTES, xg, checked, a);
            b = tile_f32(tb + (size_t)g * CPU_TILE_BYTES, xg, checked, b);
        }
        store_pair_f32(y + 2 * p, a);
        store_pair_f32(y + 2 * p + 2, b);
    }
    if (p < p1) {
        const uint8_t *ta = tiles + (size_t)p * ps;
        accf a = accf_zero();
        for (int g = 0; g < groups; g++) {
            const uint8_t *t = ta + (size_t)g * CPU_TILE_BYTES;
            pf_tail_step(t);
            a = tile_f32(t, xe + (size_t)g * CPU_GROUP, checked, a);
        }
        store_pair_f32(y + 2 * p, a);
    }
}

void cpu_avx512bf16_gemv_pairs_f32(const uint8_t *tiles, int p0, int p1,
                                   int groups, int normal, const float *xe, float *y)
{
    if (normal)
        gemv_pairs_f32(tiles, p0, p1, groups, 0, xe, y);
    else
        gemv_pairs_f32(tiles, p0, p1, groups, 1, xe, y);
}
