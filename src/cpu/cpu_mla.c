/* cpu_mla.c - latent MLA attention for one token on the CPU.
 *
 * The absorbed query ql_h = W_k,h q_nope,h reads W_k in int4, column by
 * column (cpu_pack_wk), each column's weights made exactly as the
 * reference makes them.  The tokens are split across
 * the threads (flash-decoding): each keeps per head a running max, a sum
 * and a weighted latent (the kernels' mla_range: plain vector arithmetic,
 * or on the amx path both dot products on the tile unit), merged after; a
 * thread with no token contributes nothing. */
#include "config.h"

#include <math.h>

#include "cpu.h"
#include "util.h"

#define NH HD_MLA_HEADS
#define LR HD_MLA_KV_LORA
#define RP HD_MLA_QK_ROPE

void cpu_mla(const cpu_model *cm, const cpu_layer *C, uint16_t *c_kv,
             uint16_t *k_rope, size_t pos, cpu_scratch *s, cpu_thread *th)
{
    const cpu_kernels *kern = cm->kern;
    const int t = th->t, nt = th->nt;
    const float *q = s->proj, *kv = s->proj + CPU_MLA_QN;
    const size_t L = pos + 1;
    const size_t t0 = L * (size_t)t / (size_t)nt, t1 = L * (size_t)(t + 1) / (size_t)nt;
    cpu_job jobs[NH];

    jobs[0] = cpu_job_of(&C->in_proj, 0, &th->xq, 0);
    cpu_gemv_multi(kern, jobs, 1, s->proj, cpu_next_ctr(th), th->bar);

    {   /* every thread: RoPE of the queries; the thread whose tokens end
         * at pos (the last) appends this token's cache rows, then reads
         * them itself, so no barrier is needed for them */
        float angle[RP / 2], si[RP / 2], co[RP / 2];
        for (int r = 0; r < RP / 2; r++)
            angle[r] = (float)pos * expf(-logf(10000.0f) * (2.0f * (float)r / 64.0f));
        kern->vsincos(angle, si, co, RP / 2);
        for (int h = 0; h < NH; h++) {
            const float *qr = q + h * CPU_MLA_QK + HD_MLA_QK_NOPE;
            float *out = th->qrope + h * RP;
            for (int r = 0; r < RP / 2; r++) {
                float e = hd_bf(qr[2 * r]), o = hd_bf(qr[2 * r + 1]);
                out[2 * r] = hd_bf(e * co[r] - o * si[r]);
                out[2 * r + 1] = hd_bf(o * co[r] + e * si[r]);
            }
        }
        if (t1 == L) {
            uint16_t *c_new = c_kv + pos * LR, *r_new = k_rope + pos * RP;
            for (int r = 0; r < RP / 2; r++) {
                float e = hd_bf(kv[LR + 2 * r]), o = hd_bf(kv[LR + 2 * r + 1]);
                r_new[2 * r] = hd_f32_to_bf16(e * co[r] - o * si[r]);
                r_new[2 * r + 1] = hd_f32_to_bf16(o * co[r] + e * si[r]);
            }
            for (int d = 0; d < LR; d++)
                c_new[d] = hd_f32_to_bf16(kv[d]);
        }
    }
#pragma omp for schedule(dynamic, 1) nowait
    for (int h = 0; h < NH; h++) {
        float qn[HD_MLA_QK_NOPE];
        for (int i = 0; i < HD_MLA_QK_NOPE; i++)
            qn[i] = hd_bf(q[h * CPU_MLA_QK + i]);
        kern->absorb(C->wk_q + (size_t)h * CPU_WK_HEAD_Q, C->wk_sz + (size_t)h * CPU_WK_HEAD_SZ,
                     qn, s->qlat + h * LR);
    }
    cpu_sync(th);
    /* this thread's tokens of the pos + 1 */
    kern->mla_range(c_kv, k_rope, t0, t1, s->qlat, th->qrope,
                    s->mla_ml + (size_t)t * 2 * NH,
                    s->mla_ml + (size_t)t * 2 * NH + NH,
                    s->mla_acc + (size_t)t * NH * LR,
                    s->mla_work + (size_t)t * cpu_mla_work(kern));
    cpu_sync(th);

#pragma omp for schedule(dynamic, 1) nowait
    for (int h = 0; h < NH; h++) {
        float mx = -INFINITY, den = 0.0f, f[64];
        float *lat = s->lat + h * LR;
        int used = 0;
        for (int u = 0; u < nt && u < 64; u++) {
            const float *ml = s->mla_ml + (size_t)u * 2 * NH;
            if (ml[NH + h] == 0.0f && ml[h] == -INFINITY)
                continue; /* empty range */
            if (!used || ml[h] > mx)
                mx = ml[h];
            used = 1;
        }
        for (int u = 0; u < nt && u < 64; u++) {
            const float *ml = s->mla_ml + (size_t)u * 2 * NH;
            if (ml[NH + h] == 0.0f && ml[h] == -INFINITY) {
                f[u] = 0.0f;
                continue;
            }
            f[u] = expf(ml[h] - mx);
            den += ml[NH + h] * f[u];
        }
        for (int d = 0; d < LR; d++) {
            float a = 0.0f;
            for (int u = 0; u < nt && u < 64; u++)
                if (f[u] != 0.0f)
                    a += s->mla_acc[((size_t)u * NH + (size_t)h) * LR + (size_t)d] * f[u];
            lat[d] = a / den;
        }
        cpu_prepare_x(lat, LR, &s->xq_lat[h]);
    }
    cpu_sync(th);   /* every head's input is ready */
    for (int h = 0; h < NH; h++)
        jobs[h] = cpu_job_of(&C->wv, h, &s->xq_lat[h], h * HD_MLA_V_HEAD);
    cpu_gemv_multi(kern, jobs, NH, s->attn, cpu_next_ctr(th), th->bar);
    for (int n = 0; n < CPU_A; n++)
        th->a[n] = hd_bf(s->attn[n]);
    cpu_prepare_x(th->a, CPU_A, &th->xq);
}
