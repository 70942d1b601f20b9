/* cpu_step.c - one decode step on the CPU: one OpenMP parallel region for
 * the whole step; serial pieces (norms, activation layout, RoPE, top-8) are a
 * few microseconds each and run in `single` sections. */
#include "config.h"

#include <math.h>
#include <stdlib.h>

#include "cpu.h"
#include "ref/ref.h"
#include "state_host.h"
#include "util.h"

/* Carves 64-byte aligned pieces out of one allocation. */
typedef struct carver {
    unsigned char *p;
    size_t used;
} carver;

static void *carve(carver *c, size_t bytes)
{
    void *r = c->p ? c->p + c->used : NULL;
    c->used += (bytes + 63) & ~(size_t)63;
    return r;
}

static void carve_xq(carver *c, cpu_xq *q, int k)
{
    q->k = k;
    q->xd = carve(c, (size_t)k * 2 * sizeof(float));
}

/* Lays the scratch out (s == NULL: only measures). */
static size_t layout(cpu_scratch *s, unsigned char *base, const cpu_model *cm,
                     int experts)
{
    carver c = { base, 0 };
    cpu_scratch dummy;
    const int T = cm->threads;
    if (!s)
        s = &dummy;
    carve(&c, sizeof(cpu_scratch));
    carve_xq(&c, &s->xq_in, CPU_A);
    for (int i = 0; i < HD_MLA_HEADS; i++)
        carve_xq(&c, &s->xq_lat[i], HD_MLA_KV_LORA);
    for (int i = 0; i < HD_MOE_TOPK + 1; i++)
        carve_xq(&c, &s->xq_f[i], HD_MOE_INTER);
    s->logits = carve(&c, (size_t)experts * sizeof(float));
    s->mla_ml = carve(&c, (size_t)T * 2 * HD_MLA_HEADS * sizeof(float));
    s->mla_acc = carve(&c, (size_t)T * HD_MLA_HEADS * HD_MLA_KV_LORA * sizeof(float));
    s->mla_work = carve(&c, (size_t)T * CPU_MLA_WORK * sizeof(float));
    s->threads = T;
    return c.used;
}

hd_status cpu_state_init(hd_state *state)
{
    const hd_model *m = state->model;
    const cpu_model *cm = m->backend_ctx;
    size_t bytes = layout(NULL, NULL, cm, m->experts);
    hd_host_state *h;
    hd_status st = hd_host_state_init(state, bytes);
    if (st != HD_OK)
        return st;
    h = state->impl;
    layout(h->scratch, h->scratch, cm, m->experts);
    return HD_OK;
}

hd_status cpu_step(const hd_model *model, hd_state *state,
                   const uint16_t *in_bf16, uint16_t *out_bf16)
{
    const cpu_model *cm = model->backend_ctx;
    hd_host_state *hs = state->impl;
    cpu_scratch *s = hs->scratch;
    const size_t pos = state->context;

    for (int n = 0; n < HD_HIDDEN; n++)
        s->h[n] = hd_bf16_to_f32(in_bf16[n]);

#pragma omp parallel num_threads(s->threads)
    for (int i = 0; i < model->n_layers; i++) {
        const hd_layer *L = &model->layers[i];
        const cpu_layer *C = &cm->layers[i];
        cpu_job job;

#pragma omp single
        {
            ref_rmsnorm(s->h, L->attn_norm, s->x);
            cpu_prepare_x(s->x, HD_HIDDEN, &s->xq_in);
        }
        if (L->kind == 'K')
            cpu_kda(cm, &L->kda, C, hs->S[L->slot], hs->conv[L->slot], s);
        else
            cpu_mla(cm, C, hs->c_kv[L->slot], hs->k_rope[L->slot], pos, s);
        job = cpu_job_of(&C->o_proj, 0, &s->xq_in, 0);
        cpu_gemv_multi(cm->kern, &job, 1, s->sum);
#pragma omp single
        {
            for (int n = 0; n < HD_HIDDEN; n++)
                s->h[n] = hd_bf(s->h[n] + hd_bf(s->sum[n]));
            ref_rmsnorm(s->h, L->moe_norm, s->x);
            cpu_prepare_x(s->x, HD_HIDDEN, &s->xq_in);
        }
        cpu_moe(cm, &L->moe, C, model->experts, s);
#pragma omp single
        for (int n = 0; n < HD_HIDDEN; n++)
            s->h[n] = hd_bf(s->h[n] + hd_bf(s->sum[n]));
    }
    for (int n = 0; n < HD_HIDDEN; n++)
        out_bf16[n] = hd_f32_to_bf16(s->h[n]);
    return HD_OK;
}
