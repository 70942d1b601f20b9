/* ref_kda.c - Kimi delta attention for one token (SEMANTICS.md, "K"). */
#include "config.h"

#include <math.h>

#include "ref.h"
#include "util.h"

/* The short convolution of projection j (0 q, 1 k, 2 v) over its three
 * cached rows and the new value, then the cache shift. */
static void short_conv(const uint16_t *conv_w, uint16_t *cache,
                       const float *p, float *act)
{
    uint16_t *c0 = cache, *c1 = cache + REF_A, *c2 = cache + 2 * REF_A;
    for (int n = 0; n < REF_A; n++) {
        const uint16_t *w = conv_w + (size_t)n * HD_KDA_CONV;
        float y = hd_bf16_to_f32(c0[n]) * hd_bf16_to_f32(w[0]);
        y = y + hd_bf16_to_f32(c1[n]) * hd_bf16_to_f32(w[1]);
        y = y + hd_bf16_to_f32(c2[n]) * hd_bf16_to_f32(w[2]);
        y = y + p[n] * hd_bf16_to_f32(w[3]);
        c0[n] = c1[n];
        c1[n] = c2[n];
        c2[n] = hd_f32_to_bf16(p[n]); /* exact: p is already rounded */
        act[n] = hd_bf(ref_silu(y));
    }
}

void ref_kda(const hd_kda_weights *w, float *S, uint16_t *conv,
             ref_scratch *s)
{
    const hd_qlinear *proj[4] = { &w->q_proj, &w->k_proj, &w->v_proj,
                                  &w->g_proj };
    const float q_scale = 0.08838834764831845f; /* 128^-0.5 */
    const int D = HD_KDA_HEAD_DIM;

    for (int j = 0; j < 4; j++) {
        ref_gemv(proj[j], s->x, 0, REF_A, s->proj[j]);
        for (int n = 0; n < REF_A; n++)
            s->proj[j][n] = hd_bf(s->proj[j][n]);
    }
    for (int j = 0; j < 3; j++)
        short_conv(w->conv_w + (size_t)j * REF_A * HD_KDA_CONV,
                   conv + (size_t)j * 3 * REF_A, s->proj[j], s->act[j]);
    for (int n = 0; n < REF_A; n++)
        s->decay[n] = 1.0f / (1.0f + expf(s->proj[3][n]));
    for (int h = 0; h < HD_KDA_HEADS; h++)
        s->beta[h] = ref_sigmoid(hd_bf(
            ref_dot_bf16(s->x, w->beta_proj + (size_t)h * HD_HIDDEN, HD_HIDDEN)));

    for (int h = 0; h < HD_KDA_HEADS; h++) {
        float *Sh = S + (size_t)h * D * D; /* [k][v] */
        const float *q = s->act[0] + h * D, *k = s->act[1] + h * D;
        const float *v = s->act[2] + h * D, *decay = s->decay + h * D;
        const float beta = s->beta[h];

        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++)
                Sh[i * D + j] *= decay[i];
        for (int j = 0; j < D; j++) {
            double pred = 0.0;
            for (int i = 0; i < D; i++)
                pred += (double)Sh[i * D + j] * k[i];
            s->pred[j] = (float)pred;
        }
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++)
                Sh[i * D + j] += beta * k[i] * (v[j] - s->pred[j]);
        for (int j = 0; j < D; j++) {
            double o = 0.0;
            for (int i = 0; i < D; i++)
                o += (double)Sh[i * D + j] * (q[i] * q_scale);
            s->attn[h * D + j] = hd_bf((float)o);
        }
    }
}
