/* cpu_kern_generic.h - the kernels that are plain vector arithmetic (the KDA
 * delta rule, the MLA softmax partials, exact dot products), written once
 * with GCC vector extensions and included by each instruction-set file, so
 * that the compiler emits them with that file's flags (AVX-512, AVX2/FMA or
 * the baseline).  The including file defines static isa_vexp() first. */
#ifndef HD_CPU_KERN_GENERIC_H
#define HD_CPU_KERN_GENERIC_H

#include <math.h>
#include <string.h>

typedef float gv16 __attribute__((vector_size(64)));
typedef float gv8 __attribute__((vector_size(32)));
typedef double gv8d __attribute__((vector_size(64)));
typedef uint16_t gv16h __attribute__((vector_size(32)));
typedef uint32_t gv16u __attribute__((vector_size(64)));

static inline gv16 gload(const float *p)
{
    gv16 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void gstore(float *p, gv16 v)
{
    memcpy(p, &v, sizeof v);
}
/* 16 bf16 values -> fp32 (exact). */
static inline gv16 gload_bf16(const uint16_t *p)
{
    gv16h h;
    gv16u u;
    memcpy(&h, p, sizeof h);
    u = __builtin_convertvector(h, gv16u) << 16;
    return (gv16)u;
}
static inline float ghsum(gv16 v)
{
    gv8 a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, (const char *)&v + sizeof a, sizeof b);
    a += b;
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

static double gen_dot_bf16_f64(const float *x, const uint16_t *w, int n)
{
    gv8d a0 = { 0 }, a1 = { 0 };
    double s;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        gv16 p = gload(x + i) * gload_bf16(w + i); /* exact: bf16 * bf16 */
        gv8 lo, hi;
        memcpy(&lo, &p, sizeof lo);
        memcpy(&hi, (const char *)&p + sizeof lo, sizeof hi);
        a0 += __builtin_convertvector(lo, gv8d);
        a1 += __builtin_convertvector(hi, gv8d);
    }
    a0 += a1;
    s = ((a0[0] + a0[1]) + (a0[2] + a0[3])) + ((a0[4] + a0[5]) + (a0[6] + a0[7]));
    for (; i < n; i++) {
        uint32_t u = (uint32_t)w[i] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        s += (double)(x[i] * f);
    }
    return s;
}

#define GD HD_KDA_HEAD_DIM
#define GJB (GD / 16)

static void gen_kda_head(float *S, const float *q, const float *k,
                         const float *v, const float *decay, float beta,
                         float *o)
{
    const float q_scale = 0.08838834764831845f; /* 128^-0.5 */
    gv16 pred[GJB], acc[GJB];
    for (int jb = 0; jb < GJB; jb++)
        pred[jb] = acc[jb] = (gv16){ 0 };
    /* pred = k^T (S * decay): S is read from memory once here ... */
    for (int i = 0; i < GD; i++) {
        const float d = decay[i], ki = k[i];
        for (int jb = 0; jb < GJB; jb++)
            pred[jb] += (gload(S + i * GD + jb * 16) * d) * ki;
    }
    for (int jb = 0; jb < GJB; jb++)
        pred[jb] = gload(v + jb * 16) - pred[jb];
    /* ... and updated from cache, with the output in the same sweep. */
    for (int i = 0; i < GD; i++) {
        const float d = decay[i], bk = beta * k[i], qi = q[i] * q_scale;
        for (int jb = 0; jb < GJB; jb++) {
            gv16 s = gload(S + i * GD + jb * 16) * d + bk * pred[jb];
            gstore(S + i * GD + jb * 16, s);
            acc[jb] += s * qi;
        }
    }
    for (int jb = 0; jb < GJB; jb++)
        gstore(o + jb * 16, acc[jb]);
}

/* ql[k] = sum_n qn[n] * wk[n][k] over the 128 n, k < 512 (W_k absorbed
 * into one head's query; wk bf16 [128][512]). */
static void gen_absorb(const uint16_t *wk, const float *qn, float *ql)
{
    for (int k = 0; k < HD_MLA_KV_LORA; k += 64) {
        gv16 a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
        for (int n = 0; n < HD_MLA_QK_NOPE; n++) {
            const uint16_t *w = wk + (size_t)n * HD_MLA_KV_LORA + k;
            const float q = qn[n];
            a0 += q * gload_bf16(w);
            a1 += q * gload_bf16(w + 16);
            a2 += q * gload_bf16(w + 32);
            a3 += q * gload_bf16(w + 48);
        }
        gstore(ql + k, a0);
        gstore(ql + k + 16, a1);
        gstore(ql + k + 32, a2);
        gstore(ql + k + 48, a3);
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
            for (int d = 0; d < GL; d += 16)
                gstore(cf + r * GL + d, gload_bf16(c + d));
            for (int d = 0; d < GR; d += 16)
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
                gv16 a0 = { 0 }, a1 = { 0 }, b0 = { 0 }, b1 = { 0 };
                for (int d = 0; d < GL; d += 32) {
                    gv16 qa = gload(qh + d), qb = gload(qh + d + 16);
                    a0 += qa * gload(c0 + d);
                    b0 += qb * gload(c0 + d + 16);
                    a1 += qa * gload(c1 + d);
                    b1 += qb * gload(c1 + d + 16);
                }
                for (int d = 0; d < GR; d += 16) {
                    gv16 qr = gload(rh + d);
                    a0 += qr * gload(kf + r * GR + d);
                    a1 += qr * gload(kf + (r + 1) * GR + d);
                }
                sh[r] = ghsum(a0 + b0) * score_scale;
                sh[r + 1] = ghsum(a1 + b1) * score_scale;
            }
            for (; r < n; r++) {
                const float *c0 = cf + r * GL;
                gv16 a0 = { 0 };
                for (int d = 0; d < GL; d += 16)
                    a0 += gload(qh + d) * gload(c0 + d);
                for (int d = 0; d < GR; d += 16)
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
                for (int d = 0; d < GL; d += 16)
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
                for (int d = 0; d < GL; d += 64) {
                    gv16 x0 = gload(ah + d), x1 = gload(ah + d + 16);
                    gv16 x2 = gload(ah + d + 32), x3 = gload(ah + d + 48);
                    for (r = 0; r < n; r++) {
                        const float p = sh[r], *c = cf + r * GL + d;
                        x0 += p * gload(c);
                        x1 += p * gload(c + 16);
                        x2 += p * gload(c + 32);
                        x3 += p * gload(c + 48);
                    }
                    gstore(ah + d, x0);
                    gstore(ah + d + 16, x1);
                    gstore(ah + d + 32, x2);
                    gstore(ah + d + 48, x3);
                }
            }
        }
    }
}

#endif /* HD_CPU_KERN_GENERIC_H */
