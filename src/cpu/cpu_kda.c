/* cpu_kda.c - Kimi delta attention for one token on the CPU: the heads
 * split across the threads, each head computing its own columns of the
 * four projections first (a head's projections, conv channels, gates and
 * state are its own), then one barrier. */
#include "config.h"

#include <math.h>

#include "cpu.h"
#include "util.h"

#define HD_ HD_KDA_HEAD_DIM

/* The short convolution of one head's channels of projection j, the cache
 * shift, and silu: act = bf(silu(y)).  Same operation order as the
 * reference (no fused multiply-add in this baseline-compiled file). */
static void head_conv(const cpu_kernels *kern, const uint16_t *conv_w,
                      uint16_t *cache, const float *p, float *act, int n0)
{
    uint16_t *c0 = cache, *c1 = cache + CPU_A, *c2 = cache + 2 * CPU_A;
    float y[HD_], e[HD_];
    for (int i = 0; i < HD_; i++) {
        const int n = n0 + i;
        const uint16_t *w = conv_w + (size_t)n * HD_KDA_CONV;
        float v = hd_bf16_to_f32(c0[n]) * hd_bf16_to_f32(w[0]);
        v = v + hd_bf16_to_f32(c1[n]) * hd_bf16_to_f32(w[1]);
        v = v + hd_bf16_to_f32(c2[n]) * hd_bf16_to_f32(w[2]);
        v = v + p[n] * hd_bf16_to_f32(w[3]);
        c0[n] = c1[n];
        c1[n] = c2[n];
        c2[n] = hd_f32_to_bf16(p[n]);
        y[i] = v;
        e[i] = -v;
    }
    kern->vexp(e, e, HD_);
    for (int i = 0; i < HD_; i++)
        act[n0 + i] = hd_bf(y[i] / (1.0f + e[i]));
}

void cpu_kda(const cpu_model *cm, const hd_kda_weights *w, const cpu_layer *C,
             float *S, uint16_t *conv, cpu_scratch *s, cpu_thread *th)
{
    const cpu_kernels *kern = cm->kern;
    const uint8_t *tiles = cpu_qmat_member(&C->in_proj, 0);
    const int groups = C->in_proj.groups;

    /* A head needs only its own 128 columns of q, k, v and g: the thread
     * that takes the head computes them (4 x 64 column pairs, ~0.6 MB of
     * tiles) and goes on with the head, with no barrier in between.  The
     * heads are handed out as a sweep's chunks (cpu_sweep_next): a thread
     * takes a run of consecutive heads, whose columns follow one another
     * in each projection, so the kernels' prefetch of the next block at
     * the end of a head's columns is for its own next head; a preempted
     * thread leaves the rest of its run to the others. */
    uint64_t *runs = cpu_next_ctr(th);
    size_t hc;
    while (cpu_sweep_next(runs, HD_KDA_HEADS, th->t, th->nt, &hc)) {
        const int h = (int)hc, n0 = h * HD_;
        float o[HD_], beta;
        for (int j = 0; j < 4; j++) {
            const int p0 = (j * CPU_A + n0) / 2;
            cpu_gemv_pairs(kern, tiles, p0, p0 + HD_ / 2, groups, C->in_proj.normal,
                           &th->xq, s->proj);
        }
        for (int j = 0; j < 4; j++)
            for (int i = 0; i < HD_; i++)
                s->proj[j * CPU_A + n0 + i] = hd_bf(s->proj[j * CPU_A + n0 + i]);
        for (int j = 0; j < 3; j++)
            head_conv(kern, w->conv_w + (size_t)j * CPU_A * HD_KDA_CONV,
                      conv + (size_t)j * 3 * CPU_A, s->proj + j * CPU_A,
                      s->act[j], n0);
        /* decay = 1 / (1 + exp(g)) */
        kern->vexp(s->decay + n0, s->proj + 3 * CPU_A + n0, HD_);
        for (int i = 0; i < HD_; i++)
            s->decay[n0 + i] = 1.0f / (1.0f + s->decay[n0 + i]);
        beta = hd_bf((float)kern->dot_bf16_f64(
            th->x, w->beta_proj + (size_t)h * HD_HIDDEN, HD_HIDDEN));
        beta = 1.0f / (1.0f + expf(-beta));
        kern->kda_head(S + (size_t)h * HD_ * HD_, s->act[0] + n0,
                       s->act[1] + n0, s->act[2] + n0, s->decay + n0, beta, o);
        for (int i = 0; i < HD_; i++)
            s->attn[n0 + i] = hd_bf(o[i]);
    }
    cpu_sync(th);
    cpu_prepare_x(s->attn, CPU_A, &th->xq);
}
