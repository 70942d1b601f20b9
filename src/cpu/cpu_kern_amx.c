/* cpu_kern_amx.c - the int4 GEMV on the AMX tile unit (TDPBF16PS), for
 * CPUs with AMX-BF16 (Intel Xeon since Sapphire Rapids); built with
 * -mamx-tile -mamx-bf16 on top of the avx512bf16 flags into its own
 * convenience library, called only after cpu_isa.c found the tiles in
 * cpuid and XCR0 and Linux granted this process their state
 * (hd_cpu_amx_enable).
 *
 * Why.  On such a Xeon the 512-bit vector work has two ports, the table
 * lookup (vpermw) takes one of them and vdpbf16ps costs two cycles, so the
 * vector GEMVs of cpu_kern_avx512bf16.c ran at 3.2-4 ns per 32 bytes of
 * weights with the weights hot (about 9 GB/s a core: half of what a core
 * reads from memory).  Here the vector ports only look the weights up and
 * store them; the multiply-adds go to the tile unit, which works beside
 * them (docs/PERFORMANCE.md).
 *
 * How.  A block is 8 column pairs (16 columns).  For each group (128
 * inputs) the block's 16 columns are looked up into four 16 x 32 bf16 A
 * tiles in memory, one row per column: with the tiles in the blocked
 * layout (cpu.h: the sliced tiles, a block's group by group, so a block
 * reads one stream), a column's 64 bytes are 32 words, word w holding four
 * inputs in its four nibbles; the words as loaded index the column's
 * table with nibble 0, shifted right by 4 with nibble 1, and loaded one
 * byte later (the high byte of each word in its low byte) with nibble 2,
 * then shifted with nibble 3, so A tile n holds nibble n of the 32 words.
 * Two shifts per four lookups: the shift and vpermw share the vector ports
 * (docs/PERFORMANCE.md).  The table is the column's 16 weights in both
 * halves, so the bit above each nibble, which a 32-entry vpermw also
 * reads, does not matter.  Position p of tile n is thus input 64 (p / 16)
 * + 16 n + p % 16 of the group, and x is in that order (cpu_xq.xt, made
 * by cpu_prepare_x) as one B tile a group: 16 rows (input pairs) of one
 * column per A tile for a bf16 x (cpu_xq.x1) or three for an fp32 x (hi,
 * mid, lo: cpu_xq.x3).  TDPBF16PS multiplies A tiles 0 and 1 by the B
 * tile of the first half of the group's x columns (those of A tiles 0
 * and 1), A tiles 2 and 3 by the second half, A tiles 0 and 2 into one C
 * tile, 1 and 3 into another, each C tile keeping the columns of its own
 * A tiles' x: the tile unit's time does not depend on the columns, and a
 * tile load costs about as much as a TDPBF16PS, so loading x once or
 * twice a group instead of once an A tile took 16-21 % off the GEMV
 * (docs/PERFORMANCE.md); two C tiles a block, not four, leave two for the
 * next block, which accumulates while this one's sums are stored.  The C
 * tiles and the parts are summed one group into the next block.
 *
 * Exactness, as for vdpbf16ps (cpu_kern_avx512bf16.c): the weights are the
 * exact bf16 words bf((v - z) * s) (tables by vcvtne2ps2bf16, used only
 * for matrices whose every tile is normal, cpu_qmat.normal; others go to
 * the avx512bf16 kernels whole), x is bf16 or split exactly into three bf16
 * parts, each product of two bf16 values is exact in fp32 and only the
 * sums are rounded (to nearest even).  The tile unit reads subnormal
 * inputs as zero and flushes subnormal results: subnormal x parts never
 * come here (cpu_prepare_x), and a partial sum below 2^-126 in magnitude
 * is flushed (below 1.2e-38 each).
 *
 * The column pairs of a call that do not fill an 8-pair block aligned to
 * the matrix's start go to the avx512bf16 kernels; cpu_gemv_chunk cuts the
 * sweeps at multiples of 8 pairs, so a column takes the same kernel
 * whatever the thread count.
 *
 * The file's end holds the tile work of the MLA attention (the scores and
 * the weighted sum of the cache rows); cpu_kern_avx512.c's amx_mla_range
 * lays the operands out, does the softmax and says why it is exact. */
#include "config.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"

#define AMX_PAIRS CPU_BLOCK_PAIRS
_Static_assert(AMX_PAIRS * CPU_TILE_BYTES == 17 * 64,
               "a block's group is 17 whole cache lines (amx_run's prefetches)");
#ifndef MLA_PF_HINT
#define MLA_PF_HINT _MM_HINT_T1
#endif
#ifndef AMX_L1_AHEAD
#define AMX_L1_AHEAD 2
#endif

/* LDTILECFG's 64-byte operand (palette 1). */
typedef struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* LDTILECFG from c.  GCC 12 takes the intrinsic to read only the first
 * byte of its operand: with the rest of a local configuration unread as
 * far as it knows, it may drop the stores of the rows and column widths
 * (it did in a function written like amx_configure: the tiles configured
 * with no rows, then TILEZERO raising SIGILL).  The empty asm reads all
 * 64 bytes, so the stores stay. */
static inline __attribute__((always_inline)) void amx_load_config(const amx_config *c)
{
    __asm__ volatile("" : : "m"(*c));
    _tile_loadconfig(c);
}

/* Every tile 16 rows; tiles 4 and 5 of 64 bytes, the others of cb.  The
 * GEMV (cb = 8 P, P the parts of x): tiles 0-3 the C sums, two a block
 * (0, 1 for one block and 2, 3 for the next, so that a block's sums are
 * stored while the next block's accumulate): C tile 2 par + h holds the
 * products of A tiles h and h + 2 with x's 2 P columns of B (16 columns x
 * 2 P fp32, of which the P columns h P .. h P + P - 1 are kept); 4, 5: A
 * (16 columns x 32 bf16 weights); 6, 7: B, x's columns for A tiles 0, 1
 * and for 2, 3 (16 input pairs x 2 tiles x P parts).  The MLA attention
 * (cb = 64): every tile 16 x 64 bytes. */
static void amx_configure(int cb)
{
    _Alignas(64) amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.rows[i] = 16;
        c.colsb[i] = (uint16_t)(i == 4 || i == 5 ? 64 : cb);
    }
    amx_load_config(&c);
}

/* The two columns' tables of tile t, each column's 16 exact bf16 weights
 * in both halves of a zmm (vcvtne2ps2bf16 rounds to nearest even, as
 * hd_f32_to_bf16 does, and flushes subnormals: normal matrices only).
 * Each of the four scales and zeros is the high word of a 32-bit load that
 * ends with it (the low word, the word before, is masked off): an AND
 * apiece, where a shift for two of them took the shift port, which the
 * lookups need. */
static inline __attribute__((always_inline)) void
amx_tables(const uint8_t *t, __m512i *TA, __m512i *TB)
{
    const __m512 v = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i hm = _mm512_set1_epi32((int)0xffff0000u);
    int32_t w[4];
    for (int i = 0; i < 4; i++)     /* scale A, scale B, zero A, zero B */
        memcpy(&w[i], t + CPU_TILE_W - 2 + 2 * i, 4);
    const __m512 sa = _mm512_castsi512_ps(_mm512_and_si512(_mm512_set1_epi32(w[0]), hm));
    const __m512 sb = _mm512_castsi512_ps(_mm512_and_si512(_mm512_set1_epi32(w[1]), hm));
    const __m512 za = _mm512_castsi512_ps(_mm512_and_si512(_mm512_set1_epi32(w[2]), hm));
    const __m512 zb = _mm512_castsi512_ps(_mm512_and_si512(_mm512_set1_epi32(w[3]), hm));
    const __m512 fa = _mm512_mul_ps(_mm512_sub_ps(v, za), sa);
    const __m512 fb = _mm512_mul_ps(_mm512_sub_ps(v, zb), sb);
    /* one conversion for both (B's words 0-15, A's 16-31), each half
     * then copied to both halves by a shuffle: two 1-cycle shuffles where
     * a second conversion took two cycles of both ports */
    const __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(fa, fb);
    *TA = _mm512_shuffle_i64x2(ab, ab, 0xee);
    *TB = _mm512_shuffle_i64x2(ab, ab, 0x44);
}

/* Step q of a group's tile work (s = 4 par + q, par the block's C tile
 * pair): A tile q from the rows at a (the group's lookups), as tile 4 + (q
 * & 1), times B tile 6 + q / 2 (loaded from xg at q = 0 and 2: x's
 * columns for A tiles 0 and 1, then for 2 and 3, the two halves of the
 * group's rows of xt), added to C tile 2 par + (q & 1).  A tile q's
 * products land in B's columns for it, which the other A tile on that C
 * tile leaves alone (its x there is another tile's, but its own columns
 * are the ones its partner's x leaves). */
#define AMX_STEP(S, Q, AT, BT, C)                                            \
    case S:                                                                  \
        if ((Q) == 0)                                                        \
            _tile_loadd(BT, xg, xstride);                                    \
        if ((Q) == 2)                                                        \
            _tile_loadd(BT, xg + xstride / 4, xstride);                      \
        _tile_loadd(AT, a[Q], 64);                                           \
        _tile_dpbf16ps(C, AT, BT);                                           \
        break;
static inline __attribute__((always_inline)) void
amx_tile_step(int s, uint16_t (*a)[16][32], const uint16_t *xg, int xstride)
{
    switch (s) {
    AMX_STEP(0, 0, 4, 6, 0)
    AMX_STEP(1, 1, 5, 6, 1)
    AMX_STEP(2, 2, 4, 7, 0)
    AMX_STEP(3, 3, 5, 7, 1)
    AMX_STEP(4, 0, 4, 6, 2)
    AMX_STEP(5, 1, 5, 6, 3)
    AMX_STEP(6, 2, 4, 7, 2)
    default:
    AMX_STEP(7, 3, 5, 7, 3)
    }
}
#undef AMX_STEP

/* Block par's sums (C tiles 2 par, 2 par + 1) into cs, and the tiles
 * zeroed for the block after next. */
static inline __attribute__((always_inline)) void
amx_store_sums(int par, float (*cs)[16][6])
{
    if (par) {
        _tile_stored(2, cs[0], 24);
        _tile_stored(3, cs[1], 24);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_stored(0, cs[0], 24);
        _tile_stored(1, cs[1], 24);
        _tile_zero(0);
        _tile_zero(1);
    }
}

/* A block's 16 outputs from its stored sums: column c's parts, lo, mid,
 * then hi, each the sum of A tiles 0 and 2 (cs[0], columns 0 .. P - 1)
 * plus that of 1 and 3 (cs[1], columns P .. 2 P - 1). */
static inline __attribute__((always_inline)) void
amx_sums_out(float (*cs)[16][6], int parts, float *y)
{
    for (int c = 0; c < 16; c++) {
        float s = 0.0f;
        for (int n = parts - 1; n >= 0; n--)
            s += cs[0][c][n] + cs[1][c][parts + n];
        y[c] = s;
    }
}

/* y[16 b .. 16 b + 16) = the 16 columns of block b times x, for the
 * blocks [b0, b1) of the matrix at tiles (in the blocked layout: a block's
 * tiles group by group, 8 a group, the blocks one after the other, so the
 * blocks are one stream), x at xt (one B tile's rows a group, 128 * parts
 * words).  The tile work of a group is issued one step at a time among
 * the next group's lookups, after every second pair: issued together after
 * the group's lookups, it added to their time rather than overlapping it
 * (11 % more a GEMV in a harness, docs/PERFORMANCE.md).  The blocks are
 * one pipeline: the last group's tile work of a block goes among the next
 * block's first lookups, its sums are stored after them while the next
 * block accumulates on the other pair of C tiles, and added up one group
 * later, when the stores are done (a block that waited for its own sums
 * took 5-11 % of a GEMV's time with the weights hot). */
static void amx_run(const uint8_t *tiles, int b0, int b1, int groups, const uint16_t *xt,
                    int parts, float *y)
{
    /* two sets of A rows: a group's lookups fill one while the tile loads
     * of the group before read the other */
    _Alignas(64) uint16_t abuf[2][4][16][32];
    _Alignas(64) float cs[2][2][16][6];     /* [par][C tile][column][2 P] */
    const size_t xs = (size_t)128 * (size_t)parts; /* words of x a group */
    const int xstride = 16 * parts;                 /* bytes a row of xt */
    const size_t gb = (size_t)AMX_PAIRS * CPU_TILE_BYTES;   /* bytes a group */
    const size_t bb = (size_t)groups * gb;                  /* bytes a block */
    int pend = -1;                  /* the block whose sums wait in cs */
    size_t step = 0;                /* groups done, over the blocks */

    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int b = b0; b < b1; b++) {
        const uint8_t *ta = tiles + (size_t)b * bb;
        for (int g = 0; g < groups; g++, step++) {
            uint16_t(*buf)[16][32] = abuf[step & 1];
            /* the group before: this block's, or the last of the block
             * before (its C tiles 2 ((b - 1) & 1) ...) */
            const int pg = g > 0 ? g - 1 : groups - 1;
            const int ps = 4 * ((g > 0 ? b : b - 1) & 1);
            const uint16_t *pxg = xt + (size_t)pg * xs;
            const uint8_t *tg = ta + (size_t)g * gb;
            /* unrolled, so that the tile steps' cases are known when
             * compiling (3-7 % faster in a harness) */
#pragma GCC unroll 8
            for (int j = 0; j < AMX_PAIRS; j++) {
                const uint8_t *t = tg + (size_t)j * CPU_TILE_BYTES;
                /* The group's 17 cache lines (8 tiles of 136 bytes,
                 * 1088 bytes from a line's start), two a pair and the
                 * last at pair 7: a block on into L2 (T1: a block of K =
                 * 4096 is 35 KB, most of L1, and the GEMV with its
                 * weights cold took 4-9 % longer with T0; without this
                 * prefetch 22 % longer), and AMX_L1_AHEAD groups on into
                 * L1 (3-5 % less time cold), in the next block near a
                 * block's end.  Before the blocked layout a block read 8
                 * streams a pair apart, which the hardware prefetcher did
                 * not follow. */
                const char *gl = (const char *)tg + 128 * j;
                _mm_prefetch(gl + bb, _MM_HINT_T1);
                _mm_prefetch(gl + bb + 64, _MM_HINT_T1);
                _mm_prefetch(gl + AMX_L1_AHEAD * gb, _MM_HINT_T0);
                _mm_prefetch(gl + AMX_L1_AHEAD * gb + 64, _MM_HINT_T0);
                if (j == AMX_PAIRS - 1) {
                    _mm_prefetch(gl + bb + 128, _MM_HINT_T1);
                    _mm_prefetch(gl + AMX_L1_AHEAD * gb + 128, _MM_HINT_T0);
                }
                if ((j & 1) && step > 0)
                    amx_tile_step(ps + (j >> 1), abuf[(step - 1) & 1], pxg, xstride);
                __m512i T[2];
                amx_tables(t, &T[0], &T[1]);
                for (int h = 0; h < 2; h++) {
                    /* word w of the column: nibbles 0 and 1; loaded a
                     * byte later, its high byte in the low one: nibbles
                     * 2 and 3 */
                    const __m512i r0 = _mm512_loadu_si512((const void *)(t + 64 * h));
                    const __m512i r1 = _mm512_loadu_si512((const void *)(t + 64 * h + 1));
                    _mm512_store_si512(buf[0][2 * j + h], _mm512_permutexvar_epi16(r0, T[h]));
                    _mm512_store_si512(buf[1][2 * j + h],
                                       _mm512_permutexvar_epi16(_mm512_srli_epi16(r0, 4), T[h]));
                    _mm512_store_si512(buf[2][2 * j + h], _mm512_permutexvar_epi16(r1, T[h]));
                    _mm512_store_si512(buf[3][2 * j + h],
                                       _mm512_permutexvar_epi16(_mm512_srli_epi16(r1, 4), T[h]));
                }
            }
            if (g == 0 && b > b0) {
                /* the block before has had its last tile work */
                if (pend >= 0)          /* one group a block */
                    amx_sums_out(cs[pend & 1], parts, y + 16 * pend);
                amx_store_sums((b - 1) & 1, cs[(b - 1) & 1]);
                pend = b - 1;
            } else if (pend >= 0) {
                amx_sums_out(cs[pend & 1], parts, y + 16 * pend);
                pend = -1;
            }
        }
    }
    /* the last group's tile work, then the last sums */
    for (int q = 0; q < 4; q++)
        amx_tile_step(4 * ((b1 - 1) & 1) + q, abuf[(step - 1) & 1],
                      xt + (size_t)(groups - 1) * xs, xstride);
    if (pend >= 0)
        amx_sums_out(cs[pend & 1], parts, y + 16 * pend);
    amx_store_sums((b1 - 1) & 1, cs[(b1 - 1) & 1]);
    amx_sums_out(cs[(b1 - 1) & 1], parts, y + 16 * (b1 - 1));
}

/* The 8-pair blocks aligned to the matrix's start inside [p0, p1): [a0,
 * a1), 0 when there is none. */
static int amx_span(int p0, int p1, int *a0, int *a1)
{
    *a0 = (p0 + AMX_PAIRS - 1) / AMX_PAIRS * AMX_PAIRS;
    *a1 = p1 / AMX_PAIRS * AMX_PAIRS;
    return *a0 < *a1;
}

/* Pairs [a0, a1) (whole blocks) on the tile unit: its configuration is
 * loaded here and released after, so that a thread holds the tile state
 * (8 KB more to save at each context switch) only inside a call. */
static void amx_blocks(const uint8_t *tiles, int a0, int a1, int groups,
                       const uint16_t *xt, int parts, float *y)
{
    amx_configure(8 * parts);
    amx_run(tiles, a0 / AMX_PAIRS, a1 / AMX_PAIRS, groups, xt, parts, y);
    _tile_release();
}

/* x's bf16 words in the tiles' order (cpu_xq.xt, x1): one part; xb, the
 * words in x's order, for the pairs outside the blocks. */
void cpu_amx_gemv_pairs_x1(const uint8_t *tiles, int p0, int p1, int groups, int normal,
                           const uint16_t *xt, const uint16_t *xb, float *y)
{
    int a0, a1;
    if (!normal || !amx_span(p0, p1, &a0, &a1)) {
        cpu_avx512bf16_gemv_pairs_blk(tiles, p0, p1, groups, normal, xb, y);
        return;
    }
    if (p0 < a0)
        cpu_avx512bf16_gemv_pairs_blk(tiles, p0, a0, groups, normal, xb, y);
    amx_blocks(tiles, a0, a1, groups, xt, 1, y);
    if (a1 < p1)
        cpu_avx512bf16_gemv_pairs_blk(tiles, a1, p1, groups, normal, xb, y);
}

/* x's three parts in the tiles' order (cpu_xq.xt, x3); its xe floats for
 * the pairs outside the blocks. */
void cpu_amx_gemv_pairs_x3(const uint8_t *tiles, int p0, int p1, int groups, int normal,
                           const uint16_t *xt, const float *xe, float *y)
{
    int a0, a1;
    if (!normal || !amx_span(p0, p1, &a0, &a1)) {
        cpu_avx512bf16_gemv_pairs_f32_blk(tiles, p0, p1, groups, normal, xe, y);
        return;
    }
    if (p0 < a0)
        cpu_avx512bf16_gemv_pairs_f32_blk(tiles, p0, a0, groups, normal, xe, y);
    amx_blocks(tiles, a0, a1, groups, xt, 3, y);
    if (a1 < p1)
        cpu_avx512bf16_gemv_pairs_f32_blk(tiles, a1, p1, groups, normal, xe, y);
}

/* ---- The MLA attention's multiply-adds (cpu_kern_avx512.c's
 * amx_mla_range lays the operands out and does the softmax) ---- */

/* Every tile 16 rows of 64 bytes: A and B tiles of bf16 pairs, C tiles of
 * 16 x 16 fp32. */
void cpu_amx_mla_begin(void)
{
    amx_configure(64);
}

void cpu_amx_mla_end(void)
{
    _tile_release();
}

/* Tiles 0-3: C (token rows 0-15 and 16-31 times head halves 0 and 1), 4,
 * 5: A (16 tokens x 32 latent or rope dimensions, straight from the
 * rows), 6, 7: B (16 dimension pairs x the 16 heads of a half, one part
 * of the query).  Each A tile meets six B tiles (three parts, two halves)
 * and each B tile two A tiles: eight tile loads a twelve TDPBF16PS. */
static inline __attribute__((always_inline)) void mla_scores_step(const uint16_t *q)
{
    _tile_loadd(6, q, 64);          /* head half 0 */
    _tile_loadd(7, q + 512, 64);    /* head half 1 */
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
}

void cpu_amx_mla_scores_steps(const uint16_t *c, const uint16_t *kr, const uint16_t *qt,
                              float *sc, const uint16_t *pfc, const uint16_t *pfk, int s0,
                              int s1)
{
    const int LR = HD_MLA_KV_LORA, RP = HD_MLA_QK_ROPE;
    if (s0 == 0) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int s = s0; s < s1; s++) {
        if (s < LR / 32) {
            const int kt = s;
            /* line kt of each of the next block's rows: the whole block by
             * the last kt */
            if (pfc)
                for (int r = 0; r < 32; r++)
                    _mm_prefetch((const char *)(pfc + (size_t)r * LR + 32 * kt), MLA_PF_HINT);
            if (pfk && kt < 4)
                for (int r = 8 * kt; r < 8 * kt + 8; r++) {
                    _mm_prefetch((const char *)(pfk + (size_t)r * RP), MLA_PF_HINT);
                    _mm_prefetch((const char *)(pfk + (size_t)r * RP + 32), MLA_PF_HINT);
                }
            _tile_loadd(4, c + 32 * kt, LR * 2);
            _tile_loadd(5, c + (size_t)16 * LR + 32 * kt, LR * 2);
            for (int p = 0; p < 3; p++)
                mla_scores_step(qt + ((size_t)(p * (LR / 32) + kt) * 2) * 512);
        } else {
            const int kt = s - LR / 32;
            _tile_loadd(4, kr + 32 * kt, RP * 2);
            _tile_loadd(5, kr + (size_t)16 * RP + 32 * kt, RP * 2);
            mla_scores_step(qt + ((size_t)(3 * (LR / 32) + kt) * 2) * 512);
        }
    }
    if (s1 == CPU_AMX_SC_STEPS) {
        _tile_stored(0, sc, 128);
        _tile_stored(1, sc + 16, 128);
        _tile_stored(2, sc + 16 * 32, 128);
        _tile_stored(3, sc + 16 * 32 + 16, 128);
    }
}

/* Tile 0: C (16 heads x 16 latent dimensions of acc, loaded and stored
 * back), 1: B (16 token pairs x 16 dimensions), 2-4, 5-7: A (16 heads x
 * 32 tokens of p, three parts) of the first and the second block.  One
 * head half at a time, as its six A tiles fill the rest. */
void cpu_amx_mla_values_steps(const uint16_t *pt, const uint16_t *vt, int subs, float *acc,
                              int k0, int k1)
{
    const int LR = HD_MLA_KV_LORA;
    for (int k = k0; k < k1; k++) {
        const int hh = k / (LR / 16), kt = k % (LR / 16);
        float *a = acc + (size_t)hh * 16 * LR;
        if (kt == 0) {  /* the head half's p, kept through its 32 steps */
            const uint16_t *ph = pt + (size_t)hh * 6 * 512;
            _tile_loadd(2, ph, 64);
            _tile_loadd(3, ph + 512, 64);
            _tile_loadd(4, ph + 1024, 64);
            if (subs > 1) {
                _tile_loadd(5, ph + 1536, 64);
                _tile_loadd(6, ph + 2048, 64);
                _tile_loadd(7, ph + 2560, 64);
            }
        }
        _tile_loadd(0, a + 16 * kt, LR * 4);
        _tile_loadd(1, vt + 32 * kt, LR * 4);
        _tile_dpbf16ps(0, 2, 1);
        _tile_dpbf16ps(0, 3, 1);
        _tile_dpbf16ps(0, 4, 1);
        if (subs > 1) {
            _tile_loadd(1, vt + (size_t)16 * 2 * LR + 32 * kt, LR * 4);
            _tile_dpbf16ps(0, 5, 1);
            _tile_dpbf16ps(0, 6, 1);
            _tile_dpbf16ps(0, 7, 1);
        }
        _tile_stored(0, a + 16 * kt, LR * 4);
    }
}
