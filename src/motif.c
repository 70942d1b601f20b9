/* motif.c - the tensor table of the motif (names, dtypes, shapes, rules). */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "motif.h"

/* Scale exponents of SYNTH.md, by linear map. */
enum {
    EXP_KDA_Q = -10, EXP_KDA_K = -11, EXP_KDA_V = -8, EXP_KDA_G = -8,
    EXP_O = -9, EXP_MLA_Q = -9, EXP_KV_A = -8, EXP_KV_B = -8, EXP_MOE = -9,
    EXP_BETA = -12, EXP_CONV = -8, EXP_ROUTER = -11
};

int hd_motif_pattern_ok(const char *pattern)
{
    size_t n;
    if (!pattern)
        return 0;
    n = strlen(pattern);
    if (n == 0 || n > HD_MAX_LAYERS)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (pattern[i] != 'K' && pattern[i] != 'M')
            return 0;
    return 1;
}

size_t hd_motif_tensor_count(const char *pattern)
{
    size_t n = 0;
    for (; *pattern; pattern++)
        n += *pattern == 'K' ? HD_KDA_LAYER_TENSORS : HD_MLA_LAYER_TENSORS;
    return n;
}

uint64_t hd_motif_tensor_bytes(const hd_tensor_spec *spec)
{
    uint64_t n = spec->dtype == HD_DT_BF16 ? 2 : 1;
    for (int i = 0; i < spec->ndim; i++)
        n *= spec->shape[i];
    return n;
}

typedef struct builder {
    hd_tensor_spec *specs;
    size_t n;
    char prefix[32];
} builder;

static hd_tensor_spec *add(builder *b, const char *suffix, hd_dtype dtype,
                           hd_rule rule, int exp, int ndim, uint64_t d0,
                           uint64_t d1, uint64_t d2)
{
    hd_tensor_spec *s = &b->specs[b->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s%s", b->prefix, suffix);
    s->dtype = dtype;
    s->rule = rule;
    s->exp = exp;
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = d1;
    s->shape[2] = d2;
    return s;
}

static void add_vector(builder *b, const char *suffix, hd_rule rule, int exp,
                       int ndim, uint64_t d0, uint64_t d1, uint64_t d2,
                       const uint16_t **slot)
{
    add(b, suffix, HD_DT_BF16, rule, exp, ndim, d0, d1, d2)->bf16_slot = slot;
}

/* A quantized linear map (count == 0: a plain QuantLinear, 2-D tensors;
 * otherwise a QuantExperts bank with a leading [count]). */
static void add_qlinear(builder *b, const char *name, int k, int n,
                        int count, int exp, hd_qlinear *q)
{
    char nm[48];
    int lead = count > 0;
    q->k = k;
    q->n = n;
    q->count = lead ? count : 1;
    snprintf(nm, sizeof nm, "%s.w_q", name);
    if (lead)
        add(b, nm, HD_DT_U8, HD_RULE_BYTE, 0, 3, (uint64_t)count,
            (uint64_t)k / 2, (uint64_t)n)->u8_slot = &q->w_q;
    else
        add(b, nm, HD_DT_U8, HD_RULE_BYTE, 0, 2, (uint64_t)k / 2,
            (uint64_t)n, 0)->u8_slot = &q->w_q;
    snprintf(nm, sizeof nm, "%s.scales", name);
    if (lead)
        add_vector(b, nm, HD_RULE_SCALE, exp, 3, (uint64_t)count,
                   (uint64_t)k / 128, (uint64_t)n, &q->scales);
    else
        add_vector(b, nm, HD_RULE_SCALE, exp, 2, (uint64_t)k / 128,
                   (uint64_t)n, 0, &q->scales);
    snprintf(nm, sizeof nm, "%s.zeros", name);
    if (lead)
        add_vector(b, nm, HD_RULE_ZERO, 0, 3, (uint64_t)count,
                   (uint64_t)k / 128, (uint64_t)n, &q->zeros);
    else
        add_vector(b, nm, HD_RULE_ZERO, 0, 2, (uint64_t)k / 128,
                   (uint64_t)n, 0, &q->zeros);
}

void hd_motif_layout(hd_model *model, hd_tensor_spec *specs)
{
    const int D = HD_HIDDEN, A = HD_KDA_HEADS * HD_KDA_HEAD_DIM;
    const int E = model->experts;
    builder b = { specs, 0, "" };
    int n_kda = 0, n_mla = 0;

    model->n_layers = (int)strlen(model->pattern);
    for (int i = 0; i < model->n_layers; i++) {
        hd_layer *L = &model->layers[i];
        memset(L, 0, sizeof *L);
        L->kind = model->pattern[i];
        snprintf(b.prefix, sizeof b.prefix, "blocks.%d.", i);
        add_vector(&b, "attn_norm", HD_RULE_NORM, 0, 1, D, 0, 0, &L->attn_norm);
        add_vector(&b, "moe_norm", HD_RULE_NORM, 0, 1, D, 0, 0, &L->moe_norm);
        if (L->kind == 'K') {
            hd_kda_weights *w = &L->kda;
            L->slot = n_kda++;
            add_qlinear(&b, "attn.q_proj", D, A, 0, EXP_KDA_Q, &w->q_proj);
            add_qlinear(&b, "attn.k_proj", D, A, 0, EXP_KDA_K, &w->k_proj);
            add_qlinear(&b, "attn.v_proj", D, A, 0, EXP_KDA_V, &w->v_proj);
            add_qlinear(&b, "attn.g_proj", D, A, 0, EXP_KDA_G, &w->g_proj);
            add_qlinear(&b, "attn.o_proj", A, D, 0, EXP_O, &w->o_proj);
            add_vector(&b, "attn.beta_proj.weight", HD_RULE_SMALL, EXP_BETA,
                       2, HD_KDA_HEADS, D, 0, &w->beta_proj);
            add_vector(&b, "attn.conv_w", HD_RULE_SMALL, EXP_CONV, 3, 3, A,
                       HD_KDA_CONV, &w->conv_w);
        } else {
            hd_mla_weights *w = &L->mla;
            const int qk = HD_MLA_QK_NOPE + HD_MLA_QK_ROPE;
            L->slot = n_mla++;
            add_qlinear(&b, "attn.q_proj", D, HD_MLA_HEADS * qk, 0, EXP_MLA_Q,
                        &w->q_proj);
            add_qlinear(&b, "attn.kv_a", D, HD_MLA_KV_LORA + HD_MLA_QK_ROPE, 0,
                        EXP_KV_A, &w->kv_a);
            add_qlinear(&b, "attn.kv_b", HD_MLA_KV_LORA,
                        HD_MLA_HEADS * (HD_MLA_QK_NOPE + HD_MLA_V_HEAD), 0,
                        EXP_KV_B, &w->kv_b);
            add_qlinear(&b, "attn.o_proj", HD_MLA_HEADS * HD_MLA_V_HEAD, D, 0,
                        EXP_O, &w->o_proj);
        }
        add_vector(&b, "moe.router.weight", HD_RULE_SMALL, EXP_ROUTER, 2,
                   (uint64_t)E, D, 0, &L->moe.router);
        add_qlinear(&b, "moe.gate", D, HD_MOE_INTER, E, EXP_MOE, &L->moe.gate);
        add_qlinear(&b, "moe.up", D, HD_MOE_INTER, E, EXP_MOE, &L->moe.up);
        add_qlinear(&b, "moe.down", HD_MOE_INTER, D, E, EXP_MOE, &L->moe.down);
        add_qlinear(&b, "moe.s_gate", D, HD_MOE_INTER, 1, EXP_MOE,
                    &L->moe.s_gate);
        add_qlinear(&b, "moe.s_up", D, HD_MOE_INTER, 1, EXP_MOE, &L->moe.s_up);
        add_qlinear(&b, "moe.s_down", HD_MOE_INTER, D, 1, EXP_MOE,
                    &L->moe.s_down);
    }
    model->n_kda = n_kda;
    model->n_mla = n_mla;
}
