/* cpu_kern_generic.h - the kernels that are plain vector arithmetic (the KDA
 * delta rule, the MLA softmax partials, exact dot products), written once
 * with GCC vector extensions and included by each instruction-set file, so
 * that the compiler emits them with that file's flags (AVX-512, AVX2/FMA or
 * the baseline).  The including file defines static isa_vexp() first. */
#ifndef HD_CPU_KERN_GENERIC_H
#define HD_CPU_KERN_GENERIC_H

#include <math.h>
#include <string.h>

#include "util.h"

/* GVW: floats per vector, set by the including file to its native width
 * (wider types are split by the compiler through memory: slow). */
#ifndef GVW
#define GVW 4
#endif
typedef float gvf __attribute__((vector_size(GVW * 4)));
typedef double gvd __attribute__((vector_size(GVW * 8)));
typedef uint16_t gvh __attribute__((vector_size(GVW * 2)));
typedef uint32_t gvu __attribute__((vector_size(GVW * 4)));
typedef int32_t gvi __attribute__((vector_size(GVW * 4)));

static inline gvf gload(const float *p)
{
    gvf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void gstore(float *p, gvf v)
{
    memcpy(p, &v, sizeof v);
}
/* GVW bf16 values -> fp32 (exact). */
static inline gvf gload_bf16(const uint16_t *p)
{
    gvh h;
    gvu u;
    memcpy(&h, p, sizeof h);
    u = __builtin_convertvector(h, gvu) << 16;
    return (gvf)u;
}
static inline float ghsum(gvf v)
{
    float s = 0.0f;
    for (int i = 0; i < GVW; i++)
        s += v[i];
    return s;
}

/* sum_i x[i] w[i] in double (the router's logits, the betas): two
 * vectors a pass into two double accumulators each, the row's bytes
 * prefetched 2 KB ahead.  The products are exact (bf16 times bf16 in
 * fp32) and, with 16 significant bits each, so is their sum in double for
 * any spread of magnitudes below 2^37: the order of the additions does
 * not change the result.  (One accumulator made the router's 4.6 KB rows
 * a chain of dependent adds, at about half the read bandwidth.) */
static double gen_dot_bf16_f64(const float *x, const uint16_t *w, int n)
{
    gvd a0 = { 0 }, a1 = { 0 };
    double s = 0.0;
    int i = 0;
    for (; i + 2 * GVW <= n; i += 2 * GVW) {
        gvf p0 = gload(x + i) * gload_bf16(w + i); /* exact: bf16 * bf16 */
        gvf p1 = gload(x + i + GVW) * gload_bf16(w + i + GVW);
        __builtin_prefetch(w + i + 1024);
        a0 += __builtin_convertvector(p0, gvd);
        a1 += __builtin_convertvector(p1, gvd);
    }
    for (; i + GVW <= n; i += GVW)
        a0 += __builtin_convertvector(gload(x + i) * gload_bf16(w + i), gvd);
    a0 += a1;
    for (int j = 0; j < GVW; j++)
        s += a0[j];
    for (; i < n; i++) {
        uint32_t u = (uint32_t)w[i] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        s += (double)(x[i] * f);
    }
    return s;
}

#define GD HD_KDA_HEAD_DIM

static void gen_kda_head(float *S, const float *q, const float *k,
                         const float *v, const float *decay, float beta,
                         float *o)
{
    const float q_scale = 0.08838834764831845f; /* 128^-0.5 */
    /* Column chunks of 4 vectors, so that the sums stay in registers; a
     * head's S (64 KB) stays in cache between the two sweeps. */
    for (int j0 = 0; j0 < GD; j0 += 4 * GVW) {
        gvf p[4] = { { 0 }, { 0 }, { 0 }, { 0 } }, a[4] = { { 0 }, { 0 }, { 0 }, { 0 } };
        /* pred = k^T (S * decay) */
        for (int i = 0; i < GD; i++) {
            const float d = decay[i], ki = k[i];
            for (int c = 0; c < 4; c++)
                p[c] += (gload(S + i * GD + j0 + c * GVW) * d) * ki;
        }
        for (int c = 0; c < 4; c++)
            p[c] = gload(v + j0 + c * GVW) - p[c];
        /* S = S * decay + beta k (v - pred); o = (q * scale)^T S */
        for (int i = 0; i < GD; i++) {
            const float d = decay[i], bk = beta * k[i], qi = q[i] * q_scale;
            for (int c = 0; c < 4; c++) {
                float *at = S + i * GD + j0 + c * GVW;
                gvf sv = gload(at) * d + bk * p[c];
                gstore(at, sv);
                a[c] += sv * qi;
            }
        }
        for (int c = 0; c < 4; c++)
            gstore(o + j0 + c * GVW, a[c]);
    }
}

/* A column's 16 weights bf((v - z) s), v = 0..15 (s, z: its bf16 scale
 * and zero), as floats in 16 / GVW vectors: fp32 sub and mul, then
 * hd_f32_to_bf16's rounding (nearest even; a NaN kept quiet), lane by
 * lane. */
static inline void gen_wk_table(uint16_t s, uint16_t z, gvf *T)
{
    const float sf = hd_bf16_to_f32(s), zf = hd_bf16_to_f32(z);
    for (int i = 0; i < 16 / GVW; i++) {
        gvf v;
        for (int j = 0; j < GVW; j++)
            v[j] = (float)(GVW * i + j);
        const gvu u = (gvu)((v - zf) * sf);
        const gvu nan = (gvu)((u & 0x7fffffffu) > 0x7f800000u);
        const gvu r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        const gvu q = (u & 0xffff0000u) | 0x00400000u;
        T[i] = (gvf)((q & nan) | (r & ~nan));
    }
}

/* T[idx] lane by lane (idx < 16): vpermps where a vector holds the 16
 * floats, two tables' halves where it holds 8 (GCC's variable shuffles),
 * else one lane at a time. */
static inline gvf gen_lookup16(const gvf *T, gvu idx)
{
#if !defined(__clang__) && GVW == 16
    return __builtin_shuffle(T[0], (gvi)idx);
#elif !defined(__clang__) && GVW == 8
    return __builtin_shuffle(T[0], T[1], (gvi)idx);
#else
    float t[16];
    gvf r;
    memcpy(t, T, sizeof t);
    for (int i = 0; i < GVW; i++)
        r[i] = t[idx[i] & 15u];
    return r;
#endif
}

/* ql[k] = sum_n qn[n] w[n][k] over the head's 128 n, k < 512 (W_k
 * absorbed into one head's query) from its int4 columns (cpu_pack_wk:
 * per scale group g and column n, 16 words at wq, input 128 g + 16 m + i
 * in nibble m of word i, and the scale and zero at wsz).  A group's 128
 * sums stay in vectors while its 128 columns stream by: each column's 16
 * weights made once (gen_wk_table), nibble m of GVW words at a time
 * looked up (inputs 16 m + the words' numbers, in order), times qn[n],
 * added in n's order: the products and the order of the bf16 W_k this
 * replaced (4 MB a step, where these are 1.1 MB). */
static void gen_absorb(const uint8_t *wq, const uint16_t *wsz, const float *qn, float *ql)
{
    enum { P = 16 / GVW };          /* vectors a nibble's 16 words */
    for (int g = 0; g < CPU_WK_GROUPS; g++) {
        gvf acc[8 * P];
#pragma GCC unroll 32
        for (int v = 0; v < 8 * P; v++)
            acc[v] = (gvf){ 0 };
        for (int n = 0; n < HD_MLA_QK_NOPE; n++) {
            const size_t c = (size_t)g * HD_MLA_QK_NOPE + (size_t)n;
            const float q = qn[n];
            gvu w[P];
            gvf T[P];
            memcpy(w, wq + c * (CPU_GROUP / 2), sizeof w);
            gen_wk_table(wsz[2 * c], wsz[2 * c + 1], T);
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++)
#pragma GCC unroll 4
                for (int p = 0; p < P; p++)
                    acc[m * P + p] += q * gen_lookup16(T, (w[p] >> (4 * m)) & 15u);
        }
#pragma GCC unroll 32
        for (int v = 0; v < 8 * P; v++)
            gstore(ql + g * CPU_GROUP + v * GVW, acc[v]);
    }
}

#define GL HD_MLA_KV_LORA
#define GR HD_MLA_QK_ROPE
#define GH HD_MLA_HEADS
#define GC CPU_MLA_CHUNK

/* Heads at a time in the attention's loops: 4 where there are 32 vector
 * registers (AVX-512: 16 accumulators), else 2.  Every query vector
 * loaded feeds two tokens (four with 4 heads: gen_mla_scores4), every
 * cache vector HB heads: 8 loads per 16 multiply-adds with 4 heads and
 * four tokens, 8 per 8 with 2 heads and two tokens (Zen 4 loads one zmm
 * a cycle, so the loads, not the FMAs, set the pace; docs/PERFORMANCE.md). */
#if GVW >= 16
#define HB 4
#else
#define HB 2
#endif
_Static_assert(GH % HB == 0, "whole groups of heads");

/* The scores of tokens r, r + 1 of the chunk for heads h .. h + HB - 1.
 * Each score is summed as a head at a time would sum it: even vectors of
 * d in one accumulator, odd ones in the other, then the rope part onto
 * the even one. */
static inline void gen_mla_scores(const float *cf, const float *kf, const float *qlat,
                                  const float *qrope, int h, int r, float *sc, float scale)
{
    const float *c0 = cf + r * GL, *c1 = c0 + GL;
    gvf a[HB][2], b[HB][2]; /* head, token */
#pragma GCC unroll 4
    for (int k = 0; k < HB; k++)
        a[k][0] = a[k][1] = b[k][0] = b[k][1] = (gvf){ 0 };
    for (int d = 0; d < GL; d += 2 * GVW) {
        const gvf ca = gload(c0 + d), cb = gload(c0 + d + GVW);
        const gvf da = gload(c1 + d), db = gload(c1 + d + GVW);
#pragma GCC unroll 4
        for (int k = 0; k < HB; k++) {
            const float *q = qlat + (h + k) * GL + d;
            const gvf qa = gload(q), qb = gload(q + GVW);
            a[k][0] += qa * ca;
            b[k][0] += qb * cb;
            a[k][1] += qa * da;
            b[k][1] += qb * db;
        }
    }
    for (int d = 0; d < GR; d += GVW) {
        const gvf k0 = gload(kf + r * GR + d), k1 = gload(kf + (r + 1) * GR + d);
#pragma GCC unroll 4
        for (int k = 0; k < HB; k++) {
            const gvf qr = gload(qrope + (h + k) * GR + d);
            a[k][0] += qr * k0;
            a[k][1] += qr * k1;
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < HB; k++) {
        sc[(h + k) * GC + r] = ghsum(a[k][0] + b[k][0]) * scale;
        sc[(h + k) * GC + r + 1] = ghsum(a[k][1] + b[k][1]) * scale;
    }
}

/* One token's score for one head, summed in gen_mla_scores' order. */
static inline float gen_mla_score1(const float *cf, const float *kf, const float *qh,
                                   const float *rh, int r)
{
    const float *c0 = cf + r * GL;
    gvf a0 = { 0 }, b0 = { 0 };
    for (int d = 0; d < GL; d += 2 * GVW) {
        a0 += gload(qh + d) * gload(c0 + d);
        b0 += gload(qh + d + GVW) * gload(c0 + d + GVW);
    }
    for (int d = 0; d < GR; d += GVW)
        a0 += gload(rh + d) * gload(kf + r * GR + d);
    return ghsum(a0 + b0);
}

#if HB == 4
_Static_assert(GVW == 16, "gen_hsum16x16 takes vectors of 16 floats");
/* a[k][j] += the products of len values of rows j of c (stride cs) and
 * rows k of q (stride qs), one vector of each at a time. */
static inline __attribute__((always_inline)) void
gen_scores4_part(gvf (*a)[4], const float *c, int cs, const float *q, int qs, int len)
{
    for (int d = 0; d < len; d += GVW) {
        gvf cv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            cv[j] = gload(c + j * cs + d);
#pragma GCC unroll 4
        for (int k = 0; k < HB; k++) {
            const gvf qv = gload(q + k * qs + d);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                a[k][j] += qv * cv[j];
        }
    }
}

/* The lane sums of 16 vectors of 16 floats: lane 4k + j of the result is
 * the sum of a[k][j]'s lanes.  Four levels of pairwise adds, each pairing
 * the halves of two vectors' partial sums (two shuffles and one add per
 * pair of vectors): 30 shuffles and 15 adds where 16 lane-by-lane sums
 * took 240 dependent adds and as many lane extractions, which competed
 * with the FMAs for the vector ports.  The order is fixed (a tree). */
static inline __attribute__((always_inline)) gvf gen_hsum16x16(gvf (*a)[4])
{
    gvf w[8], x[4], y[2];
#pragma GCC unroll 8
    for (int m = 0; m < 8; m++) {   /* lanes 0-7: source 2m, 8-15: 2m + 1 */
        const gvf v0 = a[(2 * m) >> 2][(2 * m) & 3], v1 = a[(2 * m + 1) >> 2][(2 * m + 1) & 3];
        w[m] = __builtin_shufflevector(v0, v1, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20,
                                       21, 22, 23) +
               __builtin_shufflevector(v0, v1, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26,
                                       27, 28, 29, 30, 31);
    }
#pragma GCC unroll 4
    for (int n = 0; n < 4; n++)     /* four lanes a source */
        x[n] = __builtin_shufflevector(w[2 * n], w[2 * n + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16,
                                       17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(w[2 * n], w[2 * n + 1], 4, 5, 6, 7, 12, 13, 14, 15,
                                       20, 21, 22, 23, 28, 29, 30, 31);
#pragma GCC unroll 2
    for (int q = 0; q < 2; q++)     /* two lanes a source */
        y[q] = __builtin_shufflevector(x[2 * q], x[2 * q + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16,
                                       17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(x[2 * q], x[2 * q + 1], 2, 3, 6, 7, 10, 11, 14, 15,
                                       18, 19, 22, 23, 26, 27, 30, 31);
    return __builtin_shufflevector(y[0], y[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22,
                                   24, 26, 28, 30) +
           __builtin_shufflevector(y[0], y[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23,
                                   25, 27, 29, 31);
}

/* The scores of tokens r .. r + 3 of the chunk for heads h .. h + 3, one
 * accumulator a score (16 of the 32 registers): every query vector loaded
 * feeds four tokens and every cache vector four heads, 8 loads per 16
 * multiply-adds instead of gen_mla_scores' 12.  A score's sum runs over d
 * in one chain (then the rope part), not in two, and its 16 lanes are
 * added by gen_hsum16x16's tree: other orders than the two-token form's,
 * within the tolerances as every order is. */
static inline void gen_mla_scores4(const float *cf, const float *kf, const float *qlat,
                                   const float *qrope, int h, int r, float *sc, float scale)
{
    gvf a[HB][4];
#pragma GCC unroll 4
    for (int k = 0; k < HB; k++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            a[k][j] = (gvf){ 0 };
    gen_scores4_part(a, cf + r * GL, GL, qlat + h * GL, GL, GL);
    gen_scores4_part(a, kf + r * GR, GR, qrope + h * GR, GR, GR);
    {
        const gvf t = gen_hsum16x16(a) * scale;
#pragma GCC unroll 4
        for (int k = 0; k < HB; k++)
            memcpy(sc + (h + k) * GC + r, (const float *)&t + 4 * k, 4 * sizeof(float));
    }
}
#endif

/* acc[k] += sum_r p_k[r] c[r] for the heads k = h .. h + HB - 1, over
 * the n tokens of the chunk in order: each cache vector loaded feeds all
 * HB heads. */
static inline void gen_mla_values(const float *cf, const float *sc, int h, int n, float *acc)
{
    for (int d = 0; d < GL; d += 4 * GVW) {
        gvf x[HB][4];
#pragma GCC unroll 4
        for (int k = 0; k < HB; k++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                x[k][j] = gload(acc + (h + k) * GL + d + j * GVW);
        for (int r = 0; r < n; r++) {
            const float *c = cf + r * GL + d;
            const gvf c0 = gload(c), c1 = gload(c + GVW);
            const gvf c2 = gload(c + 2 * GVW), c3 = gload(c + 3 * GVW);
#pragma GCC unroll 4
            for (int k = 0; k < HB; k++) {
                const float p = sc[(h + k) * GC + r];
                x[k][0] += p * c0;
                x[k][1] += p * c1;
                x[k][2] += p * c2;
                x[k][3] += p * c3;
            }
        }
#pragma GCC unroll 4
        for (int k = 0; k < HB; k++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                gstore(acc + (h + k) * GL + d + j * GVW, x[k][j]);
    }
}

/* Prefetches up to `lines` cache lines from *p on, stopping at end, and
 * advances *p past them.  Always inlined: the prefetches must stay
 * statements of the caller (cpu_kern_avx512.h, pf_pass_step). */
static inline __attribute__((always_inline)) void
gen_pf_lines(const char **p, const char *end, int lines)
{
    for (int i = 0; i < lines && *p < end; i++, *p += 64)
        __builtin_prefetch(*p);
}

/* Tokens [t0, t1) of the MLA attention for all heads: per head the
 * running maximum m, the sum l of exp(score - m) and acc = sum of
 * exp(score - m) c_kv, chunk by chunk of GC tokens (widened to fp32 once
 * a chunk).  A chunk's scores of all heads come first, HB heads and four
 * (AVX-512) or two tokens at a time, then each head's maximum, rescale
 * and exponentials, then the values HB heads at a time. */
static void gen_mla_range(const uint16_t *c_kv, const uint16_t *k_rope,
                          size_t t0, size_t t1, const float *qlat,
                          const float *qrope, float *m, float *l, float *acc,
                          float *work)
{
    const float score_scale = 0.07216878364870322f; /* 192^-0.5 */
    float *cf = work, *kf = work + GC * GL, *sc = kf + GC * GR;
    const char *pfc, *pfc_end, *pfk, *pfk_end;

    for (int h = 0; h < GH; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    memset(acc, 0, (size_t)GH * GL * sizeof(float));
    for (size_t t = t0; t < t1; t += GC) {
        const int n = t1 - t < GC ? (int)(t1 - t) : GC;
        for (int r = 0; r < n; r++) {
            const uint16_t *c = c_kv + (t + (size_t)r) * GL;
            const uint16_t *kr = k_rope + (t + (size_t)r) * GR;
            for (int d = 0; d < GL; d += GVW)
                gstore(cf + r * GL + d, gload_bf16(c + d));
            for (int d = 0; d < GR; d += GVW)
                gstore(kf + r * GR + d, gload_bf16(kr + d));
        }
        /* the next chunk's cache rows (contiguous), a few lines per block
         * of scores: spread over the chunk's arithmetic, they arrive by the
         * time the next widening reads them.  Issued all at once (or left
         * to the hardware prefetcher), the widening waited for them. */
        if (t + GC < t1) {
            const size_t nn = t1 - (t + GC) < GC ? t1 - (t + GC) : GC;
            pfc = (const char *)(c_kv + (t + GC) * GL);
            pfc_end = pfc + nn * GL * sizeof(uint16_t);
            pfk = (const char *)(k_rope + (t + GC) * GR);
            pfk_end = pfk + nn * GR * sizeof(uint16_t);
        } else {
            pfc = pfc_end = pfk = pfk_end = NULL;
        }
        for (int h = 0; h < GH; h += HB) {
            int r = 0;
#if HB == 4
            for (; r + 4 <= n; r += 4) {
                gen_pf_lines(&pfc, pfc_end, 8);
                gen_pf_lines(&pfk, pfk_end, 1);
                gen_mla_scores4(cf, kf, qlat, qrope, h, r, sc, score_scale);
            }
#endif
            for (; r + 2 <= n; r += 2) {
                gen_pf_lines(&pfc, pfc_end, 2);
                if ((r & 7) == 0)
                    gen_pf_lines(&pfk, pfk_end, 1);
                gen_mla_scores(cf, kf, qlat, qrope, h, r, sc, score_scale);
            }
            for (; r < n; r++)
                for (int k = h; k < h + HB; k++)
                    sc[k * GC + r] =
                        gen_mla_score1(cf, kf, qlat + k * GL, qrope + k * GR, r) * score_scale;
        }
        for (int h = 0; h < GH; h++) {
            float *sh = sc + h * GC, mx = m[h];
            double ls = 0.0;
            int r;
            for (r = 0; r < n; r++)
                if (sh[r] > mx) /* NaN never becomes the max */
                    mx = sh[r];
            if (mx > m[h]) { /* rescale what was summed so far */
                float f = expf(m[h] - mx);
                float *ah = acc + h * GL;
                l[h] *= f;
                for (int d = 0; d < GL; d += GVW)
                    gstore(ah + d, gload(ah + d) * f);
                m[h] = mx;
            }
            for (r = 0; r < n; r++)
                sh[r] -= mx;
            isa_vexp(sh, sh, n);
            for (r = 0; r < n; r++)
                ls += sh[r];
            l[h] += (float)ls;
        }
        for (int h = 0; h < GH; h += HB)
            gen_mla_values(cf, sc, h, n, acc);
    }
}

#endif /* HD_CPU_KERN_GENERIC_H */
