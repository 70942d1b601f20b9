/* cpu_moe.c - router, top-8, and the 9 experts as two parallel sweeps:
 * gate|up of all 9, then down of all 9, summed after (the routing weight
 * is folded into each expert's input).  Four barriers: after the router,
 * after each sweep, and after the down inputs, which the threads make a
 * share of the experts each. */
#include "config.h"

#include <math.h>

#include "cpu.h"
#include "ref/ref.h"
#include "util.h"

#define NX CPU_NX

void cpu_moe(const cpu_model *cm, const hd_moe_weights *w, const cpu_layer *C,
             int experts, cpu_scratch *s, cpu_thread *th)
{
    const cpu_kernels *kern = cm->kern;
    cpu_job jobs[NX];
    float total = 0.0f, *f = th->a;

    /* Products of bf16 values are exact; summed in double they give the
     * reference's logits, so both pick the same experts. */
#pragma omp for schedule(dynamic, 16) nowait
    for (int e = 0; e < experts; e++)
        s->logits[e] = hd_bf((float)kern->dot_bf16_f64(
            th->x, w->router + (size_t)e * HD_HIDDEN, HD_HIDDEN));
    cpu_sync(th);
    /* every thread: the same top-8 and weights */
    ref_top8(s->logits, experts, th->idx);
    for (int j = 0; j < HD_MOE_TOPK; j++) {
        th->moe_w[j] = expf(s->logits[th->idx[j]] - s->logits[th->idx[0]]);
        total += th->moe_w[j];
    }
    for (int j = 0; j < HD_MOE_TOPK; j++)
        th->moe_w[j] = th->moe_w[j] / total * 2.446f;
    th->moe_w[HD_MOE_TOPK] = 1.0f;

    for (int j = 0; j < NX; j++)
        jobs[j] = j < HD_MOE_TOPK
            ? cpu_job_of(&C->gate_up, th->idx[j], &th->xq, j * 2 * HD_MOE_INTER)
            : cpu_job_of(&C->s_gate_up, 0, &th->xq, j * 2 * HD_MOE_INTER);
    cpu_gemv_multi(kern, jobs, NX, s->gu, cpu_next_ctr(th), th->bar);

    /* the 9 down inputs (9216 exp and the layouts of x), the experts dealt
     * out to the threads: about 1 % of a step when every thread made all
     * nine, against a barrier of a microsecond or two */
    for (int j = th->t; j < NX; j += th->nt) {
        const float *g = s->gu + j * 2 * HD_MOE_INTER, *u = g + HD_MOE_INTER;
        for (int i = 0; i < HD_MOE_INTER; i++)
            f[i] = -g[i];
        kern->vexp(f, f, HD_MOE_INTER);
        for (int i = 0; i < HD_MOE_INTER; i++)
            f[i] = g[i] / (1.0f + f[i]) * u[i] * th->moe_w[j];
        cpu_prepare_x(f, HD_MOE_INTER, &s->xq_f[j]);
    }
    cpu_sync(th);
    for (int j = 0; j < NX; j++)
        jobs[j] = j < HD_MOE_TOPK
            ? cpu_job_of(&C->down, th->idx[j], &s->xq_f[j], j * HD_HIDDEN)
            : cpu_job_of(&C->s_down, 0, &s->xq_f[j], j * HD_HIDDEN);
    cpu_gemv_multi(kern, jobs, NX, s->ys, cpu_next_ctr(th), th->bar);
    /* h += bf(the weighted experts (weights folded in above) + the shared) */
    for (int n = 0; n < HD_HIDDEN; n++) {
        float a = 0.0f;
        for (int j = 0; j < NX; j++)
            a += s->ys[j * HD_HIDDEN + n];
        th->h[n] = hd_bf(th->h[n] + hd_bf(a));
    }
}
