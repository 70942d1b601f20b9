/* ref_moe.c - the mixture of experts: router, top-8, experts, shared. */
#include "config.h"

#include <math.h>

#include "ref.h"
#include "util.h"

/* a ranks above b: a larger number, NaN below everything. */
static int ranks_above(float a, float b)
{
    if (isnan(a))
        return 0;
    return isnan(b) || a > b;
}

void ref_top8(const float *logits, int experts, int idx[HD_MOE_TOPK])
{
    for (int j = 0; j < HD_MOE_TOPK; j++) {
        int best = -1;
        for (int e = 0; e < experts; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= idx[i] == e;
            if (taken)
                continue;
            /* Strictly above: a tie keeps the lower index. */
            if (best < 0 || ranks_above(logits[e], logits[best]))
                best = e;
        }
        idx[j] = best;
    }
}

/* f = silu(x . gate) * (x . up); y = f . down (all fp32, not rounded). */
static void expert(const hd_qlinear *gate, const hd_qlinear *up,
                   const hd_qlinear *down, ref_scratch *s)
{
    ref_gemv(gate, s->x, 0, HD_MOE_INTER, s->gate);
    ref_gemv(up, s->x, 0, HD_MOE_INTER, s->up);
    for (int i = 0; i < HD_MOE_INTER; i++)
        s->ff[i] = ref_silu(s->gate[i]) * s->up[i];
    ref_gemv(down, s->ff, 0, HD_HIDDEN, s->y);
}

void ref_moe(const hd_moe_weights *w, int experts, ref_scratch *s)
{
    int idx[HD_MOE_TOPK];
    float weight[HD_MOE_TOPK], total = 0.0f;
    double acc[HD_HIDDEN];

    for (int e = 0; e < experts; e++)
        s->logits[e] = hd_bf(ref_dot_bf16(s->x, w->router + (size_t)e * HD_HIDDEN,
                                          HD_HIDDEN));
    ref_top8(s->logits, experts, idx);
    for (int j = 0; j < HD_MOE_TOPK; j++) {
        weight[j] = expf(s->logits[idx[j]] - s->logits[idx[0]]);
        total += weight[j];
    }
    for (int j = 0; j < HD_MOE_TOPK; j++)
        weight[j] = weight[j] / total * 2.446f;

    for (int n = 0; n < HD_HIDDEN; n++)
        acc[n] = 0.0;
    for (int j = 0; j < HD_MOE_TOPK; j++) {
        hd_qlinear gate = hd_qlinear_member(&w->gate, idx[j]);
        hd_qlinear up = hd_qlinear_member(&w->up, idx[j]);
        hd_qlinear down = hd_qlinear_member(&w->down, idx[j]);
        expert(&gate, &up, &down, s);
        for (int n = 0; n < HD_HIDDEN; n++)
            acc[n] += (double)s->y[n] * weight[j];
    }
    expert(&w->s_gate, &w->s_up, &w->s_down, s);
    for (int n = 0; n < HD_HIDDEN; n++)
        s->sum[n] = hd_bf((float)(acc[n] + s->y[n]));
}
