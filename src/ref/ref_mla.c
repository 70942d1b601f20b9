/* ref_mla.c - latent MLA attention for one token (SEMANTICS.md, "M"). */
#include "config.h"

#include <math.h>

#include "ref.h"
#include "util.h"

void ref_mla(const hd_mla_weights *w, uint16_t *c_kv, uint16_t *k_rope,
             size_t pos, ref_scratch *s)
{
    const float score_scale = 0.07216878364870322f; /* 192^-0.5 */
    const int R = HD_MLA_QK_ROPE / 2;
    uint16_t *c_new = c_kv + pos * HD_MLA_KV_LORA;
    uint16_t *r_new = k_rope + pos * HD_MLA_QK_ROPE;

    ref_gemv(&w->q_proj, s->x, 0, HD_MLA_HEADS * REF_MLA_QK, s->q);
    for (int n = 0; n < HD_MLA_HEADS * REF_MLA_QK; n++)
        s->q[n] = hd_bf(s->q[n]);
    ref_gemv(&w->kv_a, s->x, 0, REF_MLA_KV, s->kv);
    for (int n = 0; n < REF_MLA_KV; n++)
        s->kv[n] = hd_bf(s->kv[n]);

    /* RoPE on interleaved pairs at position pos, for every query head and
     * for the key, which joins the cache with the latent at row pos. */
    for (int r = 0; r < R; r++) {
        float angle = (float)pos * expf(-logf(10000.0f) * (2.0f * (float)r / 64.0f));
        float co = cosf(angle), si = sinf(angle);
        for (int h = 0; h < HD_MLA_HEADS; h++) {
            float *qr = s->q + h * REF_MLA_QK + HD_MLA_QK_NOPE;
            float e = qr[2 * r], o = qr[2 * r + 1];
            qr[2 * r] = hd_bf(e * co - o * si);
            qr[2 * r + 1] = hd_bf(o * co + e * si);
        }
        {
            float e = s->kv[HD_MLA_KV_LORA + 2 * r];
            float o = s->kv[HD_MLA_KV_LORA + 2 * r + 1];
            r_new[2 * r] = hd_f32_to_bf16(e * co - o * si);
            r_new[2 * r + 1] = hd_f32_to_bf16(o * co + e * si);
        }
    }
    for (int d = 0; d < HD_MLA_KV_LORA; d++)
        c_new[d] = hd_f32_to_bf16(s->kv[d]); /* exact: already rounded */

    for (int h = 0; h < HD_MLA_HEADS; h++) {
        const float *q_nope = s->q + h * REF_MLA_QK;
        const float *q_rope = q_nope + HD_MLA_QK_NOPE;
        const int col_k = h * (HD_MLA_QK_NOPE + HD_MLA_V_HEAD);
        float max = -INFINITY;
        double den = 0.0;

        /* W_k of this head absorbed into the query: qlat = W_k q_nope. */
        for (int k = 0; k < HD_MLA_KV_LORA; k++) {
            double acc = 0.0;
            for (int n = 0; n < HD_MLA_QK_NOPE; n++)
                acc += (double)ref_weight(&w->kv_b, k, col_k + n) * q_nope[n];
            s->qlat[k] = (float)acc;
        }
        /* Scores over the pos + 1 tokens, then a plain softmax. */
        for (size_t t = 0; t <= pos; t++) {
            const uint16_t *c = c_kv + t * HD_MLA_KV_LORA;
            const uint16_t *kr = k_rope + t * HD_MLA_QK_ROPE;
            float score = (ref_dot_bf16(s->qlat, c, HD_MLA_KV_LORA) +
                           ref_dot_bf16(q_rope, kr, HD_MLA_QK_ROPE)) * score_scale;
            s->scores[t] = score;
            if (score > max)
                max = score;
        }
        for (int d = 0; d < HD_MLA_KV_LORA; d++)
            s->lat_acc[d] = 0.0;
        for (size_t t = 0; t <= pos; t++) {
            const uint16_t *c = c_kv + t * HD_MLA_KV_LORA;
            float p = expf(s->scores[t] - max);
            den += p;
            for (int d = 0; d < HD_MLA_KV_LORA; d++)
                s->lat_acc[d] += (double)p * hd_bf16_to_f32(c[d]);
        }
        for (int d = 0; d < HD_MLA_KV_LORA; d++)
            s->lat[d] = (float)(s->lat_acc[d] / den);
        /* o_h = bf(W_v^T lat): columns h*256 + 128 .. + 128 of kv_b. */
        ref_gemv(&w->kv_b, s->lat, col_k + HD_MLA_QK_NOPE, HD_MLA_V_HEAD,
                 s->attn + h * HD_MLA_V_HEAD);
        for (int j = 0; j < HD_MLA_V_HEAD; j++)
            s->attn[h * HD_MLA_V_HEAD + j] = hd_bf(s->attn[h * HD_MLA_V_HEAD + j]);
    }
}
