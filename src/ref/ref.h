/* ref.h - the reference backend: plain single-threaded C that follows
 * docs/SEMANTICS.md literally, every bf16 rounding point included.  It is
 * the definition every other backend is checked against: keep it simple.
 * Elementwise arithmetic is fp32.  Every sum (dot products, GEMVs, norms,
 * softmax) is accumulated in double from exact products and rounded to fp32
 * once, where SEMANTICS.md names the value: the result is then the fp32
 * value that any summation order approximates, so the reference does not
 * prefer one fast kernel's order over another's.  The library builds this
 * code with -ffp-contract=off so that no a*b+c becomes a fused
 * multiply-add. */
#ifndef HD_REF_H
#define HD_REF_H

#include <stdint.h>

#include "model.h"

#define REF_A (HD_KDA_HEADS * HD_KDA_HEAD_DIM)                 /* 4096 */
#define REF_MLA_QK (HD_MLA_QK_NOPE + HD_MLA_QK_ROPE)           /* 192  */
#define REF_MLA_KV (HD_MLA_KV_LORA + HD_MLA_QK_ROPE)           /* 576  */

/* The widest GEMV output the motif has (MLA q_proj). */
#define REF_MAX_COLS (HD_MLA_HEADS * REF_MLA_QK)

/* Work memory of one state (one step at a time uses it). */
typedef struct ref_scratch {
    float h[HD_HIDDEN];          /* the hidden vector through the layers */
    float x[HD_HIDDEN];          /* RMS-normalized input of a sublayer   */
    float attn[REF_A];           /* attention output, input of o_proj    */
    float sum[HD_HIDDEN];        /* o_proj result, then the MoE result   */
    /* KDA */
    float proj[4][REF_A];        /* q, k, v, g projections (rounded)     */
    float act[3][REF_A];         /* q, k, v after conv + silu (rounded)  */
    float decay[REF_A];
    float beta[HD_KDA_HEADS];
    float pred[HD_KDA_HEAD_DIM];
    /* MLA */
    float q[HD_MLA_HEADS * REF_MLA_QK];
    float kv[REF_MLA_KV];
    float qlat[HD_MLA_KV_LORA];  /* W_k absorbed into one head's query   */
    float lat[HD_MLA_KV_LORA];   /* one head's attention-weighted latent */
    double lat_acc[HD_MLA_KV_LORA];
    /* MoE */
    float gate[HD_MOE_INTER], up[HD_MOE_INTER], ff[HD_MOE_INTER];
    float y[HD_HIDDEN];
    /* Sized by the state: [capacity + 1] scores, [E] router logits. */
    float *scores;
    float *logits;
} ref_scratch;

/* One dequantized weight w[k][n] = bf((q - zero) * scale). */
float ref_weight(const hd_qlinear *p, int k, int n);

/* y[j] = sum_k x[k] * w[k][n0 + j] for j < cols (not rounded). */
void ref_gemv(const hd_qlinear *p, const float *x, int n0, int cols, float *y);

/* sum_i x[i] * w[i] over n values, w in bf16. */
float ref_dot_bf16(const float *x, const uint16_t *w, int n);

/* x = bf(h * rsqrt(mean(h^2) + 1e-6) * weight) over HD_HIDDEN values. */
void ref_rmsnorm(const float *h, const uint16_t *weight, float *x);

float ref_silu(float y);
float ref_sigmoid(float y);

/* Sublayers: read s->x, write s->attn (attention) or s->sum (MoE). */
void ref_kda(const hd_kda_weights *w, float *S, uint16_t *conv,
             ref_scratch *s);
void ref_mla(const hd_mla_weights *w, uint16_t *c_kv, uint16_t *k_rope,
             size_t pos, ref_scratch *s);
void ref_moe(const hd_moe_weights *w, int experts, ref_scratch *s);

/* The backend's step (state->impl is an hd_host_state whose scratch is a
 * ref_scratch). */
hd_status ref_step(const hd_model *model, hd_state *state,
                   const uint16_t *in_bf16, uint16_t *out_bf16);

/* Top-8 of E logits, best first, ties to the lower index; NaN ranks below
 * every number.  Always fills idx with 8 distinct indices in [0, E). */
void ref_top8(const float *logits, int experts, int idx[HD_MOE_TOPK]);

#endif /* HD_REF_H */
