/* cpu_kern_generic.h - the kernels that are plain vector arithmetic (the KDA
 * delta rule, the MLA softmax partials, exact dot products), written once
 * with GCC vector extensions and included by each instruction-set file, so
 * that the compiler emits them with that file's flags (AVX-512, AVX2/FMA or
 * the baseline).  The including file defines static isa_vexp() first. */
#ifndef HD_CPU_KERN_GENERIC_H
#define HD_CPU_KERN_GENERIC_H

#include <math.h>
#include <string.h>

/* GVW: floats per vector, set by the including file to its native width
 * (wider types are split by the compiler through memory: slow). */
#ifndef GVW
#define GVW 4
#endif
typedef float gvf __attribute__((vector_size(GVW * 4)));
typedef double gvd __attribute__((vector_size(GVW * 8)));
typedef uint16_t gvh __attribute__((vector_size(GVW * 2)));
typedef uint32_t gvu __attribute__((vector_size(GVW * 4)));

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

static double gen_dot_bf16_f64(const float *x, const uint16_t *w, int n)
{
    gvd a0 = { 0 };
    double s = 0.0;
    int i = 0;
    for (; i + GVW <= n; i += GVW) {
        gvf p = gload(x + i) * gload_bf16(w + i); /* exact: bf16 * bf16 */
        a0 += __builtin_convertvector(p, gvd);
    }
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

/* ql[k] = sum_n qn[n] * wk[n][k] over the 128 n, k < 512 (W_k absorbed
 * into one head's query; wk bf16 [128][512]). */
static void gen_absorb(const uint16_t *wk, const float *qn, float *ql)
{
    for (int k = 0; k < HD_MLA_KV_LORA; k += 4 * GVW) {
        gvf a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
        for (int n = 0; n < HD_MLA_QK_NOPE; n++) {
            const uint16_t *w = wk + (size_t)n * HD_MLA_KV_LORA + k;
            const float q = qn[n];
            a0 += q * gload_bf16(w);
            a1 += q * gload_bf16(w + GVW);
            a2 += q * gload_bf16(w + 2 * GVW);
            a3 += q * gload_bf16(w + 3 * GVW);
        }
        gstore(ql + k, a0);
        gstore(ql + k + GVW, a1);
        gstore(ql + k + 2 * GVW, a2);
        gstore(ql + k + 3 * GVW, a3);
    }
}

#define GL HD_MLA_KV_LORA
#define GR HD_MLA_QK_ROPE
#define GH HD_MLA_HEADS
#define GC CPU_MLA_CHUNK

static void gen_mla_range(const uint16_t *c_kv, const uint16_t *k_rope,
                          size_t t0, size_t t1, const float *qlat,
                          const float *qrope, float *m, float *l, float *acc,
                          float *work)
{
    const float score_scale = 0.07216878364870322f; /* 192^-0.5 */
    float *cf = work, *kf = work + GC * GL, *sc = kf + GC * GR;

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
        for (int h = 0; h < GH; h++) {
            const float *qh = qlat + h * GL, *rh = qrope + h * GR;
            float *sh = sc + h * GC, mx = m[h];
            double ls = 0.0;
            int r = 0;
            /* Two tokens at a time: each query load feeds two products. */
            for (; r + 2 <= n; r += 2) {
                const float *c0 = cf + r * GL, *c1 = c0 + GL;
                gvf a0 = { 0 }, a1 = { 0 }, b0 = { 0 }, b1 = { 0 };
                for (int d = 0; d < GL; d += 2 * GVW) {
                    gvf qa = gload(qh + d), qb = gload(qh + d + GVW);
                    a0 += qa * gload(c0 + d);
                    b0 += qb * gload(c0 + d + GVW);
                    a1 += qa * gload(c1 + d);
                    b1 += qb * gload(c1 + d + GVW);
                }
                for (int d = 0; d < GR; d += GVW) {
                    gvf qr = gload(rh + d);
                    a0 += qr * gload(kf + r * GR + d);
                    a1 += qr * gload(kf + (r + 1) * GR + d);
                }
                sh[r] = ghsum(a0 + b0) * score_scale;
                sh[r + 1] = ghsum(a1 + b1) * score_scale;
            }
            for (; r < n; r++) {
                const float *c0 = cf + r * GL;
                gvf a0 = { 0 };
                for (int d = 0; d < GL; d += GVW)
                    a0 += gload(qh + d) * gload(c0 + d);
                for (int d = 0; d < GR; d += GVW)
                    a0 += gload(rh + d) * gload(kf + r * GR + d);
                sh[r] = ghsum(a0) * score_scale;
            }
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
            {
                float *ah = acc + h * GL;
                for (int d = 0; d < GL; d += 4 * GVW) {
                    gvf x0 = gload(ah + d), x1 = gload(ah + d + GVW);
                    gvf x2 = gload(ah + d + 2 * GVW), x3 = gload(ah + d + 3 * GVW);
                    for (r = 0; r < n; r++) {
                        const float p = sh[r], *c = cf + r * GL + d;
                        x0 += p * gload(c);
                        x1 += p * gload(c + GVW);
                        x2 += p * gload(c + 2 * GVW);
                        x3 += p * gload(c + 3 * GVW);
                    }
                    gstore(ah + d, x0);
                    gstore(ah + d + GVW, x1);
                    gstore(ah + d + 2 * GVW, x2);
                    gstore(ah + d + 3 * GVW, x3);
                }
            }
        }
    }
}

#endif /* HD_CPU_KERN_GENERIC_H */
