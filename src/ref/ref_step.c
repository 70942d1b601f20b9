/* ref_step.c - one decode step through every layer (SEMANTICS.md). */
#include "config.h"

#include "ref.h"
#include "state_host.h"
#include "util.h"

/* h = bf(h + v) over the hidden vector. */
static void residual(float *h, const float *v)
{
    for (int n = 0; n < HD_HIDDEN; n++)
        h[n] = hd_bf(h[n] + v[n]);
}

hd_status ref_step(const hd_model *model, hd_state *state,
                   const uint16_t *in_bf16, uint16_t *out_bf16)
{
    hd_host_state *hs = state->impl;
    ref_scratch *s = hs->scratch;

    for (int n = 0; n < HD_HIDDEN; n++)
        s->h[n] = hd_bf16_to_f32(in_bf16[n]);
    for (int i = 0; i < model->n_layers; i++) {
        const hd_layer *L = &model->layers[i];

        ref_rmsnorm(s->h, L->attn_norm, s->x);
        if (L->kind == 'K')
            ref_kda(&L->kda, hs->S[L->slot], hs->conv[L->slot], s);
        else
            ref_mla(&L->mla, hs->c_kv[L->slot], hs->k_rope[L->slot],
                    state->context, s);
        ref_gemv(L->kind == 'K' ? &L->kda.o_proj : &L->mla.o_proj, s->attn, 0,
                 HD_HIDDEN, s->sum);
        for (int n = 0; n < HD_HIDDEN; n++)
            s->sum[n] = hd_bf(s->sum[n]);
        residual(s->h, s->sum);

        ref_rmsnorm(s->h, L->moe_norm, s->x);
        ref_moe(&L->moe, model->experts, s);
        residual(s->h, s->sum);
    }
    for (int n = 0; n < HD_HIDDEN; n++)
        out_bf16[n] = hd_f32_to_bf16(s->h[n]);
    return HD_OK;
}
