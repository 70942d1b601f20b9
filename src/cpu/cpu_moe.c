/* cpu_moe.c - router, top-8, and the 9 experts as two parallel sweeps:
 * gate|up of all 9, then down of all 9, summed after (the routing weight
 * is folded into each expert's input). */
#include "config.h"

#include <math.h>

#include "cpu.h"
#include "ref/ref.h"
#include "util.h"

#define NX (HD_MOE_TOPK + 1)

void cpu_moe(const cpu_model *cm, const hd_moe_weights *w, const cpu_layer *C,
             int experts, cpu_scratch *s)
{
    const cpu_kernels *kern = cm->kern;
    cpu_job jobs[NX];

    /* Products of bf16 values are exact; summed in double they give the
     * reference's logits, so both pick the same experts. */
#pragma omp for schedule(static)
    for (int e = 0; e < experts; e++)
        s->logits[e] = hd_bf((float)kern->dot_bf16_f64(
            s->x, w->router + (size_t)e * HD_HIDDEN, HD_HIDDEN));
#pragma omp single
    {
        float total = 0.0f;
        ref_top8(s->logits, experts, s->idx);
        for (int j = 0; j < HD_MOE_TOPK; j++) {
            s->moe_w[j] = expf(s->logits[s->idx[j]] - s->logits[s->idx[0]]);
            total += s->moe_w[j];
        }
        for (int j = 0; j < HD_MOE_TOPK; j++)
            s->moe_w[j] = s->moe_w[j] / total * 2.446f;
        s->moe_w[HD_MOE_TOPK] = 1.0f;
    }
    for (int j = 0; j < NX; j++)
        jobs[j] = j < HD_MOE_TOPK
            ? cpu_job_of(&C->gate_up, s->idx[j], &s->xq_in, j * 2 * HD_MOE_INTER)
            : cpu_job_of(&C->s_gate_up, 0, &s->xq_in, j * 2 * HD_MOE_INTER);
    cpu_gemv_multi(kern, jobs, NX, s->gu);

#pragma omp for schedule(static)
    for (int j = 0; j < NX; j++) {
        const float *g = s->gu + j * 2 * HD_MOE_INTER, *u = g + HD_MOE_INTER;
        float *f = s->ff + j * HD_MOE_INTER;
        for (int i = 0; i < HD_MOE_INTER; i++)
            f[i] = -g[i];
        kern->vexp(f, f, HD_MOE_INTER);
        for (int i = 0; i < HD_MOE_INTER; i++)
            f[i] = g[i] / (1.0f + f[i]) * u[i] * s->moe_w[j];
        cpu_prepare_x(f, HD_MOE_INTER, &s->xq_f[j]);
    }
    for (int j = 0; j < NX; j++)
        jobs[j] = j < HD_MOE_TOPK
            ? cpu_job_of(&C->down, s->idx[j], &s->xq_f[j], j * HD_HIDDEN)
            : cpu_job_of(&C->s_down, 0, &s->xq_f[j], j * HD_HIDDEN);
    cpu_gemv_multi(kern, jobs, NX, s->ys);
    /* sum = the weighted experts (weights folded in above) + the shared */
#pragma omp for schedule(static)
    for (int n = 0; n < HD_HIDDEN; n++) {
        float a = 0.0f;
        for (int j = 0; j < NX; j++)
            a += s->ys[j * HD_HIDDEN + n];
        s->sum[n] = a;
    }
}
