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
 * through fp32 FMAs (cpu_table_normal, sliced_tables), and what is left is
 * a product or partial sum below 2^-126 in magnitude flushed to zero (an
 * absolute error below 1.2e-38 each: nothing a normed x and real scales
 * produce).
 *
 * Why it is faster.  Per 64 weights the fp32 kernel spends ~15 zmm
 * instructions, 6 of them widening bf16 to fp32 (shift, mask) and 4 FMAs;
 * here the looked-up words go straight into vdpbf16ps (two products per
 * lane), in the order of x's bf16 words.  The tables are built with
 * vcvtne2ps2bf16 (tile_tables_bf16), one group ahead of the weights that
 * use them, and the tiles are in the sliced layout (cpu.h), made for
 * these kernels: see sliced_pass.  Zen 4 runs zmm instructions as two
 * 256-bit halves: the ymm form (one column per ymm) needs no column bit
 * in the indices. */
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

/* ---- the sliced layout (cpu.h) ----
 *
 * A pass takes one or two tiles of the same group (two or four columns)
 * at a time and builds the tables of the next group while it streams the
 * current group's weight bytes: built in front of their use, each table's
 * chain (broadcast, shift, sub, mul, convert: ~15 cycles) held up the
 * vpermw that needed it.  A column's 32-byte chunk is one load; the load
 * and its shifts by 4, 8 and 12 index the table (a ymm vpermw reads the
 * low 4 bits of each word) and give the weights of 16 consecutive inputs
 * each.  Per 64 weights: 1 load, 3 shifts, 4 vpermw, 4 vdpbf16ps, against
 * 2 widenings, 2 shifts, 4 vpermw, 4 vdpbf16ps in the paired layout, whose
 * widenings took the two ports that vpermw runs on.  Measured with the
 * weights hot (one thread, K 1024 x N 256, Zen 4): 5.6 core cycles per
 * 32 bytes against 6.4 for the paired kernel, and 8.3 against 9.6 with
 * fp32 x (docs/PERFORMANCE.md).
 *
 * Three ways to multiply (xm, a constant at every call): X_DOT, x's bf16
 * words by vdpbf16ps (fma8 instead for a tile whose weights may be
 * subnormal); X_XE, fp32 x in the xe layout by FMAs (fma16); X_XD, fp32
 * x in the xd layout (cpu_kernels.gemv_pairs; the step never takes it on
 * this instruction set, since its activations always have xb or xe). */
enum { X_DOT, X_XE, X_XD };


/* acc_e += the even weights of w times x[0..7], acc_o += the odd ones
 * times x[8..15] (x in the xe layout: 16 inputs' even floats, then their
 * odd ones). */
static inline __attribute__((always_inline)) void
fma16(__m256 *acc_e, __m256 *acc_o, __m256i w, const float *x)
{
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    *acc_e = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)),
                             _mm256_loadu_ps(x), *acc_e);
    *acc_o = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w, hm)),
                             _mm256_loadu_ps(x + 8), *acc_o);
}

/* acc_e, acc_o += the even and the odd weights of w times the 16 inputs
 * whose floats are in the xd layout at xd (16 floats per 8 inputs: the
 * four even ones twice, then the four odd ones twice). */
static inline __attribute__((always_inline)) void
fma16_xd(__m256 *acc_e, __m256 *acc_o, __m256i w, const float *xd)
{
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    const __m256 xe = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(xd)),
                                           _mm_loadu_ps(xd + 16), 1);
    const __m256 xo = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(xd + 8)),
                                           _mm_loadu_ps(xd + 24), 1);
    *acc_e = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), xe, *acc_e);
    *acc_o = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w, hm)), xo, *acc_o);
}

/* One column's 128 inputs of a group (its 64 bytes at cb, table T) onto
 * its four accumulators a; xg: the group's x (words for X_DOT, floats
 * otherwise); dot: vdpbf16ps (else fma8) for X_DOT. */
static inline __attribute__((always_inline)) void
col_group(const uint8_t *cb, const void *xg, __m256i T, __m256 *a, const int xm, int dot)
{
#pragma GCC unroll 2
    for (int ch = 0; ch < 2; ch++) {
        const __m256i r = _mm256_loadu_si256((const void *)(cb + 32 * ch));
        const __m256i idx[4] = { r, _mm256_srli_epi16(r, 4), _mm256_srli_epi16(r, 8),
                                 _mm256_srli_epi16(r, 12) };
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const __m256i w = _mm256_permutexvar_epi16(idx[i], T);
            const int k = 64 * ch + 16 * i;         /* the slice's first input */
            if (xm == X_DOT) {
                const uint16_t *xb = (const uint16_t *)xg + k;
                a[i] = dot ? dp8(a[i], w, xb) : fma8(a[i], w, xb);
            } else if (xm == X_XE) {
                fma16(&a[2 * (i & 1)], &a[2 * (i & 1) + 1], w, (const float *)xg + k);
            } else {
                fma16_xd(&a[2 * (i & 1)], &a[2 * (i & 1) + 1], w, (const float *)xg + 2 * k);
            }
        }
    }
}

/* The tables of tile t into T[0] (column A) and T[1]; 0 where checked and
 * the tile's weights may be subnormal (then tile_table's exact words). */
static inline __attribute__((always_inline)) int
sliced_tables(const uint8_t *t, const int checked, __m256i *T)
{
    if (!checked || __builtin_expect(tile_normal(t), 1)) {
        tile_tables_bf16(t, &T[0], &T[1]);
        return 1;
    }
    const __m512i E = tile_table(t);
    T[0] = _mm512_castsi512_si256(E);
    T[1] = _mm512_extracti64x4_epi64(E, 1);
    return 0;
}

/* The columns of nt tiles (1 or 2; the first's group g at ta + g gs,
 * the second's at tb + g gs) times x into y[0 .. 2 nt); checked: test
 * every tile (tile_normal) and give one whose weights may be subnormal
 * tile_table's exact words and FMAs.  The tables of group g + 1 are built
 * while group g streams (the last group's twice: no branch).  blocked:
 * the tiles are in the blocked layout (gs = 8 CPU_TILE_BYTES), each
 * prefetched PF_GROUPS groups ahead; else in the sliced one (gs =
 * CPU_TILE_BYTES, tb = ta + the pair's bytes), the two pairs' bytes one
 * stream prefetched PF_AHEAD ahead. */
#define PF_GROUPS 4
static inline __attribute__((always_inline)) void
sliced_pass(const uint8_t *ta, const uint8_t *tb, const size_t gs, const int nt, int groups,
            const int checked, const int xm, const void *x, float *y, const int blocked)
{
    const size_t xstride = xm == X_DOT ? CPU_GROUP * sizeof(uint16_t)
                         : xm == X_XE  ? CPU_GROUP * sizeof(float)
                                       : 2 * CPU_GROUP * sizeof(float);
    const char *pf = (const char *)ta + PF_AHEAD;
    __m256 a0[4], a1[4], b0[4], b1[4];
    __m256i TA[2], TB[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
    int oka, okb = 1;
    for (int i = 0; i < 4; i++)
        a0[i] = a1[i] = b0[i] = b1[i] = _mm256_setzero_ps();
    oka = sliced_tables(ta, checked, TA);
    if (nt == 2)
        okb = sliced_tables(tb, checked, TB);
    for (int g = 0; g < groups; g++) {
        const size_t off = (size_t)g * gs;
        const size_t nx = (size_t)(g + 1 < groups ? g + 1 : g) * gs;
        const void *xg = (const char *)x + (size_t)g * xstride;
        __m256i NA[2], NB[2];
        int nka, nkb = 1;
        if (blocked) {
            pf_tile(ta + off + PF_GROUPS * gs);
            if (nt == 2)
                pf_tile(tb + off + PF_GROUPS * gs);
        } else if (nt == 2) {
            pf = pf_pass_step(pf);
        } else {
            pf_tail_step(ta + off);
        }
        nka = sliced_tables(ta + nx, checked, NA);
        if (nt == 2)
            nkb = sliced_tables(tb + nx, checked, NB);
        col_group(ta + off, xg, TA[0], a0, xm, checked ? oka : 1);
        col_group(ta + off + CPU_TILE_W / 2, xg, TA[1], a1, xm, checked ? oka : 1);
        if (nt == 2) {
            col_group(tb + off, xg, TB[0], b0, xm, checked ? okb : 1);
            col_group(tb + off + CPU_TILE_W / 2, xg, TB[1], b1, xm, checked ? okb : 1);
            TB[0] = NB[0];
            TB[1] = NB[1];
            okb = nkb;
        }
        TA[0] = NA[0];
        TA[1] = NA[1];
        oka = nka;
    }
    y[0] = hsum8(_mm256_add_ps(_mm256_add_ps(a0[0], a0[1]), _mm256_add_ps(a0[2], a0[3])));
    y[1] = hsum8(_mm256_add_ps(_mm256_add_ps(a1[0], a1[1]), _mm256_add_ps(a1[2], a1[3])));
    if (nt == 2) {
        y[2] = hsum8(_mm256_add_ps(_mm256_add_ps(b0[0], b0[1]), _mm256_add_ps(b0[2], b0[3])));
        y[3] = hsum8(_mm256_add_ps(_mm256_add_ps(b1[0], b1[1]), _mm256_add_ps(b1[2], b1[3])));
    }
}

/* Columns of pairs [p0, p1) times x, two pairs per pass; the tiles in
 * the blocked layout where blocked, else in the sliced one. */
static inline __attribute__((always_inline)) void
sliced_pairs(const uint8_t *tiles, int p0, int p1, int groups, const int checked,
             const int xm, const void *x, float *y, const int blocked)
{
    const cpu_layout lay = blocked ? CPU_LAYOUT_BLOCKED : CPU_LAYOUT_SLICED;
    const size_t gs = blocked ? CPU_BLOCK_PAIRS * CPU_TILE_BYTES : CPU_TILE_BYTES;
    int p = p0;
    for (; p + 2 <= p1; p += 2)
        sliced_pass(tiles + cpu_tile_at(lay, groups, p, 0),
                    tiles + cpu_tile_at(lay, groups, p + 1, 0), gs, 2, groups, checked, xm,
                    x, y + 2 * p, blocked);
    if (p < p1)
        sliced_pass(tiles + cpu_tile_at(lay, groups, p, 0), NULL, gs, 1, groups, checked,
                    xm, x, y + 2 * p, blocked);
}

/* sliced_pairs with the tiles tested only where the matrix is not normal
 * (normal: every tile passed at the repacking): not testing them saves
 * the test and keeps the loop branch-free. */
static inline __attribute__((always_inline)) void
tested_pairs(const uint8_t *tiles, int p0, int p1, int groups, int normal, const int xm,
             const void *x, float *y, const int blocked)
{
    if (normal)
        sliced_pairs(tiles, p0, p1, groups, 0, xm, x, y, blocked);
    else
        sliced_pairs(tiles, p0, p1, groups, 1, xm, x, y, blocked);
}

/* x's bf16 words (cpu_xq.xb). */
void cpu_avx512bf16_gemv_pairs(const uint8_t *tiles, int p0, int p1,
                               int groups, int normal, const uint16_t *xb, float *y)
{
    tested_pairs(tiles, p0, p1, groups, normal, X_DOT, xb, y, 0);
}

void cpu_avx512bf16_gemv_pairs_blk(const uint8_t *tiles, int p0, int p1,
                                   int groups, int normal, const uint16_t *xb, float *y)
{
    tested_pairs(tiles, p0, p1, groups, normal, X_DOT, xb, y, 1);
}

/* ---- fp32 x ----
 *
 * The expert down inputs and W_v's are fp32 with 24 significant bits.
 * The weights are looked up as above; each ymm of 16 weight words (16
 * consecutive inputs) is widened to fp32, the even words shifted up and
 * the odd ones masked (exact), and multiplied with x by fp32 FMAs, 8 per
 * 32 bytes of tiles; xe holds x per 16 inputs, the 8 even ones then the 8
 * odd ones, so that both halves meet x as they are.  Nothing is rounded
 * but the sums, and any fp32 x is taken as it is (subnormals, infinities,
 * NaN).  A tile whose weights may be subnormal gets tile_table's exact
 * rounding instead of vcvtne2ps2bf16; the FMAs keep subnormal weights.
 *
 * Measured against the three-part kernel it replaced (x = hi + mid + lo,
 * three vdpbf16ps per weight vector, 12 per 32 bytes, bound by Zen 4's two
 * FMA pipes): 6.40 against 7.12 TSC ticks per 32 bytes hot, in the paired
 * layout (docs/PERFORMANCE.md). */
void cpu_avx512bf16_gemv_pairs_f32(const uint8_t *tiles, int p0, int p1,
                                   int groups, int normal, const float *xe, float *y)
{
    tested_pairs(tiles, p0, p1, groups, normal, X_XE, xe, y, 0);
}

void cpu_avx512bf16_gemv_pairs_f32_blk(const uint8_t *tiles, int p0, int p1,
                                       int groups, int normal, const float *xe, float *y)
{
    tested_pairs(tiles, p0, p1, groups, normal, X_XE, xe, y, 1);
}

/* x's floats in the xd layout: every tile tested (no normal flag here). */
void cpu_avx512bf16_gemv_pairs_xd(const uint8_t *tiles, int p0, int p1, int groups,
                                  const float *xd, float *y)
{
    sliced_pairs(tiles, p0, p1, groups, 1, X_XD, xd, y, 0);
}

void cpu_avx512bf16_gemv_pairs_xd_blk(const uint8_t *tiles, int p0, int p1, int groups,
                                      const float *xd, float *y)
{
    sliced_pairs(tiles, p0, p1, groups, 1, X_XD, xd, y, 1);
}
