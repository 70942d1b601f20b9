/* cpu.h - the CPU backend: OpenMP threads, int4 weights repacked at load
 * time, and one kernel table per instruction set (portable C, AVX2/FMA,
 * AVX-512 F/BW/VL, and the same with AVX512_BF16) chosen once per model
 * from cpuid/xgetbv (HD_CPU_ISA=portable|avx2|avx512|avx512bf16 forces
 * one).
 *
 * Numbers.  Every weight is dequantized exactly as SEMANTICS.md says,
 * w = bf((q - z) * s), and multiplied by the fp32 activation: skipping the
 * bf16 rounding of w (or quantizing x) moves h by ~1e-3, enough to flip the
 * bf16 router logits of near-tied experts, and one flipped expert moves a
 * step's output by ~2e-2 (measured on golden case B).  Only the summation
 * order differs from the reference.
 *
 * Weight layout (cpu_repack.c).  A matrix (K inputs, N outputs) becomes
 * tiles of 2 columns x 128 inputs (one scale group), stored column pair by
 * column pair ([pair][group], so a thread that owns a range of pairs streams
 * one contiguous range of memory), 136 bytes each:
 *   4 chunks of 32 bytes: 16 bytes of column A, then 16 of column B; byte b
 *   of chunk i holds k = 32i + b in its low and k = 32i + 16 + b in its
 *   high nibble;
 *   then bf16 scale A, scale B, zero A, zero B.
 * A 128-bit lane thus holds one column, and vpshufb looks its nibbles up in
 * that column's 16-entry table of bf((v - z) * s), built per tile; the AVX2
 * kernel streams two column pairs at once (two tiles of the same group); the
 * AVX-512 kernel holds both tables of a tile in one zmm for vpermw.  The
 * bytes equal the file's int4 bytes: nothing is expanded.
 *
 * The AVX512_BF16 kernels take the same tiles with the 128 weight bytes in
 * another order, the sliced layout (CPU_LAYOUT_SLICED): column A's 64
 * bytes, then column B's; a column's 32-byte chunk c holds its inputs
 * 64c .. 64c + 63, its 16-bit word j the inputs 64c + j, + 16, + 32 and
 * + 48 in bits 0-3, 4-7, 8-11 and 12-15.  One 32-byte load then indexes
 * the column's table as it is (vpermw on a ymm reads the low 4 bits of a
 * word) and shifted right by 4, 8 and 12: four vpermw give the weights of
 * 16 consecutive inputs each, with no widening of bytes to words (which
 * took the shuffle ports that vpermw needs).  The scales and zeros are
 * where they are in the paired layout.
 *
 * The AMX kernels take the sliced tiles in another order of the tiles, the
 * blocked layout (CPU_LAYOUT_BLOCKED): the pairs in blocks of 8
 * (CPU_BLOCK_PAIRS, the pairs of one AMX block), a block's tiles group by
 * group ([block][group][8 pairs], cpu_tile_at), so that a block, which
 * reads its 8 pairs a group at a time, reads one stream of memory and not
 * 8 streams a pair apart (the cores' prefetchers follow one stream
 * sooner).  A matrix whose pair count is not a multiple of 8 has its last
 * block padded with zero tiles, so that a tile's place never depends on
 * the pair count.
 */
#ifndef HD_CPU_H
#define HD_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "model.h"

#define CPU_GROUP 128               /* inputs per tile (one scale group)  */
#define CPU_TILE_W 128              /* weight bytes per tile              */
#define CPU_TILE_BYTES 136          /* + 2 bf16 scales + 2 bf16 zeros     */

/* The order of a tile's 128 weight bytes (above). */
typedef enum cpu_layout {
    CPU_LAYOUT_PAIRED = 0,          /* portable, avx2, avx512 */
    CPU_LAYOUT_SLICED = 1,          /* avx512bf16 */
    CPU_LAYOUT_BLOCKED = 2          /* amx: sliced tiles, 8 pairs a block */
} cpu_layout;

#define CPU_BLOCK_PAIRS 8           /* pairs of a block (blocked layout)  */

/* The byte offset of tile (pair p, group g) in a matrix of `groups`
 * groups in `layout`. */
static inline size_t cpu_tile_at(cpu_layout layout, int groups, int p, int g)
{
    if (layout == CPU_LAYOUT_BLOCKED)
        return (((size_t)(p / CPU_BLOCK_PAIRS) * (size_t)groups + (size_t)g) *
                    CPU_BLOCK_PAIRS + (size_t)(p % CPU_BLOCK_PAIRS)) * CPU_TILE_BYTES;
    return ((size_t)p * (size_t)groups + (size_t)g) * CPU_TILE_BYTES;
}

typedef enum cpu_isa {
    CPU_ISA_PORTABLE = 0,
    CPU_ISA_AVX2 = 1,
    CPU_ISA_AVX512 = 2,
    CPU_ISA_AVX512BF16 = 3,
    CPU_ISA_AMX = 4                 /* avx512bf16 + AMX tiles for the GEMVs */
} cpu_isa;

/* 1 when no weight bf((v - z) s), v = 0..15, of a column with scale s
 * and zero point z (bf16 words) can be subnormal: the vdpbf16ps kernels
 * build such a column's table with vcvtne2ps2bf16 and multiply it as bf16,
 * both of which flush subnormals to zero.  From the exponents alone: a
 * nonzero fl(v - z) is at least min(1, ulp(z)) >= 2^(ez - 134) (v = 0
 * gives |z| > ulp(z)), so |(v - z) s| >= 2^-126 when es - 127 +
 * min(ez - 134, 0) >= -126, es and ez the biased exponents (a subnormal or
 * zero scale fails). */
static inline int cpu_table_normal(uint16_t s, uint16_t z)
{
    const int es = (s >> 7) & 0xff, ez = (z >> 7) & 0xff;
    const int dz = (z & 0x7fff) == 0 ? 0 : (ez - 134 < 0 ? ez - 134 : 0);
    return es + dz >= 1;
}

/* A repacked matrix, or a bank of `count` matrices of the same shape.
 * `normal`: cpu_table_normal holds for every column of every tile (set by
 * the repacking; the data never change), so the kernels that would check
 * it per tile need not. */
typedef struct cpu_qmat {
    uint8_t *tiles;                 /* [count][member_tiles][136]          */
    int k, n, groups, pairs, count;
    size_t member_tiles;            /* pairs * groups, the pairs rounded up
                                     * to a multiple of 8 where blocked    */
    int normal;
    cpu_layout layout;              /* the kernels' (cpu_kernels.layout)   */
} cpu_qmat;

/* An activation vector of k values in the layout the kernels multiply
 * with: per 8 inputs the even ones twice, then the odd ones twice
 * ([x0 x2 x4 x6 x0 x2 x4 x6 x1 x3 x5 x7 x1 x3 x5 x7], one copy per 128-bit
 * lane; the AVX2 kernel widens even and odd bf16 weights separately).
 *
 * When every x is exactly a bf16 (the RMSNorm outputs, the attention
 * outputs: vectors the step rounds to bf16 anyway) and normal or zero,
 * also as bf16 words for vdpbf16ps, whose products of two bf16 are exact
 * in fp32: so x is not rounded.  In x's own order (the kernel reads the
 * nibble bytes in theirs).  xb may be NULL (never used); bf16 says whether
 * it holds x.
 *
 * Any other x (the expert down inputs and MLA's W_v inputs, fp32 with 24
 * significant bits; a bf16 x with a subnormal) where xe is not NULL and
 * the kernels have a kernel for it: as floats per 16 inputs, the 8 even
 * ones, then the 8 odd ones ([x0 x2 .. x14 x1 x3 .. x15]), which meet the
 * even and the odd bf16 weights of 16 consecutive inputs widened to fp32;
 * f32 says whether xe holds x.
 *
 * For the AMX kernels (cpu_kern_amx.c), where xt is not NULL and k is a
 * multiple of 128, x also in the order of their tiles: per group of 128
 * inputs four tiles of 32, position p of tile n holding input 64 (p / 16)
 * + 16 n + p % 16 of the group (the order in which the kernel looks the
 * sliced weights up), as one B tile a group: 16 rows, row r holding the
 * input pair at positions 2r, 2r + 1 of each tile n = 0 .. 3 in turn, P
 * parts each: the words part0(2r) part0(2r + 1) part1(2r) ... of tile 0,
 * then of tile 1 ... (8 P words a row, 128 P a group).  The tile unit
 * multiplies each A tile by all four tiles' columns and the kernel keeps
 * the products of the matching ones, so that a group's x takes one tile
 * load.  A bf16 x as its words (P = 1; x1 says whether xt
 * holds them, set with bf16).  Any other x as three bf16 parts, hi + mid
 * + lo = x exactly (P = 3; x3 says whether xt holds them): only where
 * every x is finite and every part normal or zero (the tile unit reads a
 * subnormal bf16 as zero), and xe holds x too (the kernel's fallback).
 *
 * xd holds x only where neither bf16 nor f32 is set (cpu_prepare_x skips
 * the work otherwise), so xb and xe must be NULL for kernels without a
 * gemv_pairs_bf16 and a gemv_pairs_f32 respectively, as the step's
 * scratch has them (cpu_step.c), or such kernels would read stale xd. */
typedef struct cpu_xq {
    float *xd;                      /* [2k] (see above: not always x) */
    uint16_t *xb;                   /* [k] or NULL */
    float *xe;                      /* [k] or NULL */
    uint16_t *xt;                   /* [3k] or NULL */
    int k;
    int bf16;                       /* xb holds x (cpu_prepare_x) */
    int f32;                        /* xe holds x (cpu_prepare_x) */
    int x1;                         /* xt holds x's bf16 words */
    int x3;                         /* xt holds x's three parts */
} cpu_xq;

/* One matrix-vector product of a multi-product call: y[yoff + n] = the
 * product of one matrix (or bank member) with x. */
typedef struct cpu_job {
    const uint8_t *tiles;
    int pairs, groups;
    const cpu_xq *x;
    int yoff;
    int normal;                     /* cpu_qmat.normal of the matrix      */
} cpu_job;

/* The kernels of one instruction set. */
typedef struct cpu_kernels {
    const char *name;               /* "portable", "avx2", "avx512"        */
    cpu_layout layout;              /* of the tiles its GEMVs read         */
    /* y[2p], y[2p + 1] = columns of pairs [p0, p1) times x. */
    void (*gemv_pairs)(const uint8_t *tiles, int p0, int p1, int groups,
                       const float *xd, float *y);
    /* The same from x's bf16 words (cpu_xq.xb); NULL where the instruction
     * set has no such kernel.  Call both through cpu_gemv_pairs.  normal:
     * the matrix's cpu_qmat.normal (0: the kernel checks every tile). */
    void (*gemv_pairs_bf16)(const uint8_t *tiles, int p0, int p1, int groups,
                            int normal, const uint16_t *xb, float *y);
    /* The same from x's floats in the xe layout (cpu_xq.f32); NULL where
     * the instruction set has no such kernel. */
    void (*gemv_pairs_f32)(const uint8_t *tiles, int p0, int p1, int groups,
                           int normal, const float *xe, float *y);
    /* The same from x's bf16 words in xt's order (cpu_xq.x1), xb for what
     * the kernel leaves to gemv_pairs_bf16; NULL where the instruction set
     * has no such kernel. */
    void (*gemv_pairs_x1)(const uint8_t *tiles, int p0, int p1, int groups,
                          int normal, const uint16_t *xt, const uint16_t *xb, float *y);
    /* The same from x's three bf16 parts (cpu_xq.x3), xe for what the
     * kernel leaves to gemv_pairs_f32; NULL where the instruction set has
     * no such kernel. */
    void (*gemv_pairs_x3)(const uint8_t *tiles, int p0, int p1, int groups,
                          int normal, const uint16_t *xt, const float *xe, float *y);
    /* dst[i] = exp(src[i]) (SLEEF 1-ulp where built with it); in place ok. */
    void (*vexp)(float *dst, const float *src, int n);
    /* sin and cos of n angles (accurate range reduction). */
    void (*vsincos)(const float *a, float *s, float *c, int n);
    /* sum_i x[i] * w[i], w bf16, products exact, summed in double. */
    double (*dot_bf16_f64)(const float *x, const uint16_t *w, int n);
    /* ql = W_k,h q_nope,h for one head from its int4 W_k (cpu_layer's
     * wk_q and wk_sz at the head's offset, CPU_WK_HEAD_Q bytes and
     * CPU_WK_HEAD_SZ words a head). */
    void (*absorb)(const uint8_t *wq, const uint16_t *wsz, const float *qn, float *ql);
    /* One KDA head: S [128 k][128 v] updated in place; o = q^T S (fp32). */
    void (*kda_head)(float *S, const float *q, const float *k, const float *v,
                     const float *decay, float beta, float *o);
    /* Softmax partial of all 32 heads over tokens [t0, t1): per head the
     * running max m, the sum l of exp(score - m) and acc = sum p c_kv[t]. */
    void (*mla_range)(const uint16_t *c_kv, const uint16_t *k_rope,
                      size_t t0, size_t t1, const float *qlat,
                      const float *qrope, float *m, float *l, float *acc,
                      float *work);
    /* Floats of mla_range's work memory a thread; 0: CPU_MLA_WORK. */
    size_t mla_work;
} cpu_kernels;

extern const cpu_kernels cpu_kernels_portable;
#ifdef HD_CPU_HAVE_AVX2
extern const cpu_kernels cpu_kernels_avx2;
#endif
#ifdef HD_CPU_HAVE_AVX512
extern const cpu_kernels cpu_kernels_avx512;
#endif
#ifdef HD_CPU_HAVE_AVX512BF16
extern const cpu_kernels cpu_kernels_avx512bf16;
#ifdef HD_CPU_HAVE_AMX
extern const cpu_kernels cpu_kernels_amx;
void cpu_amx_gemv_pairs_x1(const uint8_t *tiles, int p0, int p1, int groups, int normal,
                           const uint16_t *xt, const uint16_t *xb, float *y);
void cpu_amx_gemv_pairs_x3(const uint8_t *tiles, int p0, int p1, int groups, int normal,
                           const uint16_t *xt, const float *xe, float *y);
/* The MLA attention's multiply-adds on the tile unit (cpu_kern_avx512.c's
 * amx_mla_range): the tiles configured for them, and released. */
void cpu_amx_mla_begin(void);
void cpu_amx_mla_end(void);
/* The scores of 32 tokens, sc [32 tokens][32 heads], in
 * CPU_AMX_SC_STEPS steps (the latent dimensions 32 at a time, then the
 * rope's), [s0, s1) of them a call: step 0 zeroes the sums, the last
 * stores them.  c_kv rows at c (LR words apart), k_rope rows at kr (RP
 * words apart), the query's B tiles at qt (CPU_AMX_QT tiles); pfc, pfk:
 * the next 32 rows to prefetch, or NULL.  Between the calls of one block
 * nothing else may use the tiles (the caller's vector work may). */
#define CPU_AMX_SC_STEPS (HD_MLA_KV_LORA / 32 + HD_MLA_QK_ROPE / 32)
void cpu_amx_mla_scores_steps(const uint16_t *c, const uint16_t *kr, const uint16_t *qt,
                              float *sc, const uint16_t *pfc, const uint16_t *pfk, int s0,
                              int s1);
/* acc [32 heads][LR] += p times the values of 32 subs tokens, in
 * CPU_AMX_VAL_STEPS steps (head half k / (LR / 16), 16 latent dimensions
 * k % (LR / 16)), [k0, k1) of them a call: p's A tiles at pt ([2 head
 * halves][2 blocks][3 parts]), loaded at a head half's first step and
 * kept in the tiles through its others (so nothing else may use the
 * tiles between the calls of one head half), the values' B tiles at vt
 * ([2 blocks][16 token pairs][LR][2]). */
#define CPU_AMX_VAL_STEPS (2 * HD_MLA_KV_LORA / 16)
void cpu_amx_mla_values_steps(const uint16_t *pt, const uint16_t *vt, int subs, float *acc,
                              int k0, int k1);
#define CPU_AMX_QT 100      /* B tiles of the query: 3 x 16 x 2, rope 2 x 2 */
#endif
/* cpu_kern_avx512bf16.c (built with -mavx512bf16). */
void cpu_avx512bf16_gemv_pairs(const uint8_t *tiles, int p0, int p1,
                               int groups, int normal, const uint16_t *xb, float *y);
void cpu_avx512bf16_gemv_pairs_f32(const uint8_t *tiles, int p0, int p1,
                                   int groups, int normal, const float *xe, float *y);
void cpu_avx512bf16_gemv_pairs_xd(const uint8_t *tiles, int p0, int p1, int groups,
                                  const float *xd, float *y);
/* The same three on tiles in the blocked layout (the AMX kernels'). */
void cpu_avx512bf16_gemv_pairs_blk(const uint8_t *tiles, int p0, int p1,
                                   int groups, int normal, const uint16_t *xb, float *y);
void cpu_avx512bf16_gemv_pairs_f32_blk(const uint8_t *tiles, int p0, int p1,
                                       int groups, int normal, const float *xe, float *y);
void cpu_avx512bf16_gemv_pairs_xd_blk(const uint8_t *tiles, int p0, int p1, int groups,
                                      const float *xd, float *y);
#endif

/* Which of x's layouts (cpu_xq) are kept for the kernels kern: its bf16
 * words and its xe floats only for kernels with a GEMV for them (the xd
 * floats stand for them otherwise, cpu_prepare_x), the tiles' order only
 * for kernels with an AMX GEMV of either. */
static inline void cpu_xq_layouts(const cpu_kernels *kern, int *xb, int *xe, int *xt)
{
    *xb = kern->gemv_pairs_bf16 != NULL;
    *xe = kern->gemv_pairs_f32 != NULL;
    *xt = (*xb && kern->gemv_pairs_x1 != NULL) || (*xe && kern->gemv_pairs_x3 != NULL);
}

/* Columns of pairs [p0, p1) times x: from x's bf16 words where the kernels
 * have a kernel for them and x is bf16-exact (in xt's order where the
 * kernels take that and x has it), else from its three parts or its xe
 * floats where the kernels have a kernel for those and x has them, else
 * from its floats in the xd layout.  normal: the matrix's cpu_qmat.normal. */
static inline void cpu_gemv_pairs(const cpu_kernels *kern,
                                  const uint8_t *tiles, int p0, int p1,
                                  int groups, int normal, const cpu_xq *x,
                                  float *y)
{
    if (kern->gemv_pairs_x1 && x->x1)
        kern->gemv_pairs_x1(tiles, p0, p1, groups, normal, x->xt, x->xb, y);
    else if (kern->gemv_pairs_bf16 && x->bf16)
        kern->gemv_pairs_bf16(tiles, p0, p1, groups, normal, x->xb, y);
    else if (kern->gemv_pairs_x3 && x->x3)
        kern->gemv_pairs_x3(tiles, p0, p1, groups, normal, x->xt, x->xe, y);
    else if (kern->gemv_pairs_f32 && x->f32)
        kern->gemv_pairs_f32(tiles, p0, p1, groups, normal, x->xe, y);
    else
        kern->gemv_pairs(tiles, p0, p1, groups, x->xd, y);
}

#define CPU_MLA_CHUNK 32            /* tokens per softmax chunk            */
/* Floats of mla_range's work memory. */
#define CPU_MLA_WORK ((size_t)CPU_MLA_CHUNK * (HD_MLA_KV_LORA + HD_MLA_QK_ROPE) + \
                      (size_t)HD_MLA_HEADS * CPU_MLA_CHUNK)
/* Floats of the work memory of kern's mla_range a thread. */
static inline size_t cpu_mla_work(const cpu_kernels *kern)
{
    return kern->mla_work ? kern->mla_work : CPU_MLA_WORK;
}

#define CPU_A (HD_KDA_HEADS * HD_KDA_HEAD_DIM)          /* 4096 */
#define CPU_MLA_QK (HD_MLA_QK_NOPE + HD_MLA_QK_ROPE)    /* 192  */
#define CPU_MLA_KV (HD_MLA_KV_LORA + HD_MLA_QK_ROPE)    /* 576  */
#define CPU_MLA_QN (HD_MLA_HEADS * CPU_MLA_QK)          /* 6144 */
/* W_k of kv_b in int4 for the absorbed query (cpu_pack_wk): per head,
 * scale group g (inputs 128 g ..) and column n < 128 of the head's W_k,
 * 16 little-endian 32-bit words in wk_q (input 128 g + 16 m + i in nibble
 * m of word i: nibble m of the 16 words gives 16 inputs in order) and the
 * scale and zero (bf16) in wk_sz. */
#define CPU_WK_GROUPS (HD_MLA_KV_LORA / CPU_GROUP)      /* 4 */
#define CPU_WK_HEAD_Q ((size_t)CPU_WK_GROUPS * HD_MLA_QK_NOPE * (CPU_GROUP / 2))
#define CPU_WK_HEAD_SZ ((size_t)CPU_WK_GROUPS * HD_MLA_QK_NOPE * 2)

typedef struct cpu_layer {
    /* K: q|k|v|g concatenated (N 16384); M: q_proj|kv_a (N 6720). */
    cpu_qmat in_proj;
    cpu_qmat o_proj;
    /* M: W_k in int4 (CPU_WK_*: 1 MB and 64 KB), read column by column
     * by the absorbed query; W_v of head h: [h] 512 x 128 int4. */
    uint8_t *wk_q;
    uint16_t *wk_sz;
    cpu_qmat wv;                    /* count 32, k 512, n 128   */
    cpu_qmat gate_up;               /* bank of E: gate|up (N 2048) */
    cpu_qmat down;                  /* bank of E */
    cpu_qmat s_gate_up, s_down;
} cpu_layer;

typedef struct cpu_model {
    cpu_isa isa;
    const cpu_kernels *kern;
    int threads;
    cpu_layer layers[HD_MAX_LAYERS];
} cpu_model;

/* ---- cpu_repack.c ---- */
/* A matrix (or bank of count) of k inputs and n outputs whose tiles will
 * be packed in `layout` (the kernels' cpu_kernels.layout). */
hd_status cpu_qmat_alloc(cpu_qmat *m, int k, int n, int count, cpu_layout layout);
void cpu_qmat_free(cpu_qmat *m);
/* Packs columns [src_col0, + ncols) of bank member src_member of src into
 * columns [dst_col0, + ncols) of member `member` of m (same k; the column
 * numbers are multiples of 16): concatenations and column slices.  Clears
 * m->normal where a packed column fails cpu_table_normal. */
void cpu_repack_part(cpu_qmat *m, int member, int dst_col0,
                     const hd_qlinear *src, int src_member, int src_col0,
                     int ncols);
/* W_k of kv_b into wk_q and wk_sz (CPU_WK_*, cpu_layer). */
void cpu_pack_wk(uint8_t *wk_q, uint16_t *wk_sz, const hd_qlinear *kv_b);
/* Repacks raw arrays (hd-bench): w_q [k/2][n], scales/zeros [k/128][n]. */
void cpu_repack_raw(cpu_qmat *m, int member, const uint8_t *w_q,
                    const uint16_t *scales, const uint16_t *zeros);
static inline const uint8_t *cpu_qmat_member(const cpu_qmat *m, int j)
{
    return m->tiles + (size_t)j * m->member_tiles * CPU_TILE_BYTES;
}
/* A job for member j of m. */
static inline cpu_job cpu_job_of(const cpu_qmat *m, int j, const cpu_xq *x,
                                 int yoff)
{
    cpu_job r = { cpu_qmat_member(m, j), m->pairs, m->groups, x, yoff, m->normal };
    return r;
}

/* ---- cpu_quant.c ---- */
/* Lays x out for the kernels (k a multiple of 8): as bf16 words (and
 * q->bf16 = 1) when q->xb is not NULL, k is a multiple of 32 and every
 * x[i] is a bf16 value that is normal or zero (vdpbf16ps treats subnormal
 * inputs as zero); else, when q->xe is not NULL and k is a multiple of
 * 16, in the xe layout (and q->f32 = 1); else in the xd layout.  Also in
 * xt's order where that applies (cpu_xq). */
void cpu_prepare_x(const float *x, int k, cpu_xq *q);

/* ---- cpu_gemv.c ---- */
/* A barrier for the threads of one parallel region.  It spins for a few
 * tens of microseconds, then sleeps (a futex on Linux): on a machine shared
 * with other work, a thread that waits for a preempted partner frees its
 * core, and the scheduler moves the partner onto it.  (OpenMP's own
 * barriers spin for milliseconds by default; with one core busy elsewhere
 * a step then crawled.) */
typedef struct cpu_bar {
    int count, gen, sleepers;
} cpu_bar;
void cpu_barrier(cpu_bar *b, int nt);

/* Runs the jobs inside a parallel region (every thread of the team calls
 * it with the same jobs, the same run words, one per thread of the team,
 * zeroed before the region, and the same barrier): the column pairs of
 * all jobs are cut into chunks, and the chunks into one run per thread
 * (cpu_sweep_next), so that a thread the OS preempts holds up only the
 * chunk it is in.  Ends with cpu_barrier(bar) when bar is not NULL
 * (nothing to wait for with one thread). */
void cpu_gemv_multi(const cpu_kernels *kern, const cpu_job *jobs, int njobs,
                    float *y, uint64_t *runs, cpu_bar *bar);
/* The next chunk of a sweep of nchunks chunks for thread t of nt: chunk
 * c of run r = [nchunks r / nt, nchunks (r + 1) / nt).  Thread t takes its
 * own run's chunks from the front, in order, then the other runs' from
 * their back, run t + 1 first; runs[r] (zeroed before the sweep) counts
 * the chunks taken from each end.  Every chunk is handed out once; 0 when
 * none is left. */
int cpu_sweep_next(uint64_t *runs, size_t nchunks, int t, int nt, size_t *chunk);
/* Column pairs per chunk of a sweep of `pairs` pairs over nt threads: about
 * 2 chunks per thread, enough to even out a slow thread, few enough that
 * the calls' own costs stay small (each call of the AMX kernel configures
 * the tiles and starts its pipeline of blocks afresh: with about 8 chunks
 * a thread the two smaller int4 shapes took 3-6 % longer,
 * docs/PERFORMANCE.md) and the run words (cache lines the threads share)
 * stay cheap; a multiple of 8, so
 * that the kernels' two-pair passes and the AMX kernel's eight-pair blocks
 * line up (every matrix has a multiple of 8 pairs, so a column takes the
 * same kernel whatever the thread count). */
static inline size_t cpu_gemv_chunk(size_t pairs, int nt)
{
    return nt <= 1 ? pairs : (pairs / ((size_t)nt * 2) + 8) & ~(size_t)7;
}

/* ---- cpu_isa.c ---- */
/* The instruction set to use: HD_CPU_ISA if set, else the best the CPU
 * runs (the order of cpu_isa.c).  HD_ERR_BACKEND_UNAVAILABLE (with a message) if the variable asks
 * for one the CPU or this build lacks, HD_ERR_INVALID_ARGUMENT if unknown. */
hd_status cpu_choose_isa(cpu_isa *isa, char *err, size_t err_size);
const cpu_kernels *cpu_kernels_for(cpu_isa isa);
/* Threads for a requested count (0: OMP_NUM_THREADS / all cores). */
int cpu_resolve_threads(int requested);

#define CPU_NX (HD_MOE_TOPK + 1)      /* experts per token: 8 + shared */
/* Sweeps (cpu_sweep_next's run words) per layer and step, at most: a KDA
 * layer's heads, o_proj, gate/up and down; an MLA layer's projections, W_v,
 * o_proj, gate/up and down. */
#define CPU_SWEEPS_PER_LAYER 5

/* What each thread of a step keeps to itself: the hidden state and the
 * activations that every thread computes identically (a few microseconds
 * of redundant work instead of a barrier each). */
typedef struct cpu_thread {
    float *h, *x;                   /* [HD_HIDDEN] */
    float *a;                       /* [CPU_A] scratch */
    float *qrope;                   /* [32 * 64] MLA: roped queries */
    cpu_xq xq;                      /* k 4096: x, then the attention output */
    float moe_w[CPU_NX];
    int idx[HD_MOE_TOPK];
    int t, nt;                      /* this thread, team size */
    uint64_t *ctr;                  /* the step's sweeps' run words */
    int sweep;                      /* next sweep */
    cpu_bar *bar;                   /* the step's barrier */
} cpu_thread;

/* The run words of this thread's next sweep (the same on every thread):
 * one per thread of the team. */
static inline uint64_t *cpu_next_ctr(cpu_thread *th)
{
    return th->ctr + (size_t)th->sweep++ * (size_t)th->nt;
}

/* All threads of the step meet here. */
static inline void cpu_sync(cpu_thread *th)
{
    cpu_barrier(th->bar, th->nt);
}

/* Work memory of one state (cpu_step.c carves it out of the host state's
 * scratch; nothing is allocated per step).  Shared by the threads. */
typedef struct cpu_scratch {
    float sum[HD_HIDDEN];
    float attn[CPU_A];
    float proj[4 * CPU_A];          /* K: q|k|v|g; M: q|kv (6720)       */
    float act[3][CPU_A];            /* K: a_q, a_k, a_v                 */
    float decay[CPU_A];
    float qlat[HD_MLA_HEADS * HD_MLA_KV_LORA];
    float lat[HD_MLA_HEADS * HD_MLA_KV_LORA];
    float gu[CPU_NX * 2 * HD_MOE_INTER];
    float ys[CPU_NX * HD_HIDDEN];   /* the experts' outputs */
    cpu_xq xq_lat[HD_MLA_HEADS];    /* k 512 */
    cpu_xq xq_f[CPU_NX];            /* k 1024: the experts' down inputs */
    float *logits;                  /* [E] */
    float *mla_ml;                  /* [threads][2][32]: max, sum */
    float *mla_acc;                 /* [threads][32][512] */
    float *mla_work;                /* [threads][cpu_mla_work()] */
    cpu_thread *th;                 /* [threads] */
    cpu_bar *bar;                   /* own cache line */
    uint64_t *ctr;                  /* [n_layers * CPU_SWEEPS_PER_LAYER][threads] */
    int n_ctr;
    int threads;
} cpu_scratch;

/* Layer pieces, called by every thread of the step's parallel region with
 * its cpu_thread; each starts from th->xq (the normed input, laid out) and
 * cpu_kda / cpu_mla end with th->xq = the attention output, cpu_moe with
 * th->h updated. */
void cpu_kda(const cpu_model *cm, const hd_kda_weights *w, const cpu_layer *C,
             float *S, uint16_t *conv, cpu_scratch *s, cpu_thread *th);
void cpu_mla(const cpu_model *cm, const cpu_layer *C, uint16_t *c_kv,
             uint16_t *k_rope, size_t pos, cpu_scratch *s, cpu_thread *th);
void cpu_moe(const cpu_model *cm, const hd_moe_weights *w, const cpu_layer *C,
             int experts, cpu_scratch *s, cpu_thread *th);

/* ---- cpu_step.c ---- */
hd_status cpu_state_init(hd_state *state);
hd_status cpu_step(const hd_model *model, hd_state *state,
                   const uint16_t *in_bf16, uint16_t *out_bf16);

extern const hd_backend_ops hd_cpu_backend;

#endif /* HD_CPU_H */
