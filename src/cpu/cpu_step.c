/* cpu_step.c - one decode step on the CPU: one OpenMP parallel region for
 * the whole step.  The small serial pieces (residual adds, norms, the
 * activation layout, top-8) are a few microseconds each and every thread
 * does them itself on its own copy of h (cpu_thread): the threads meet only
 * where one needs what another computed, 5 barriers per KDA layer and its
 * MoE, 9 per MLA layer and its MoE (24 per step of pattern KKKM, ~70
 * before). */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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

/* x's floats in the xd layout; its bf16 words where xb (kernels with a
 * gemv_pairs_bf16), its floats in the xe layout where xe (kernels with a
 * gemv_pairs_f32), its bf16 words or three bf16 parts in the AMX tiles'
 * order where xt (kernels with a gemv_pairs_x1, or with both a
 * gemv_pairs_f32 and a gemv_pairs_x3). */
static void carve_xq(carver *c, cpu_xq *q, int k, int xb, int xe, int xt)
{
    q->k = k;
    q->bf16 = q->f32 = q->x1 = q->x3 = 0;
    q->xd = carve(c, (size_t)k * 2 * sizeof(float));
    q->xb = xb ? carve(c, (size_t)k * sizeof(uint16_t)) : NULL;
    q->xe = xe ? carve(c, (size_t)k * sizeof(float)) : NULL;
    q->xt = xt ? carve(c, (size_t)k * 3 * sizeof(uint16_t)) : NULL;
}

/* Lays the scratch out (s == NULL: only measures). */
static size_t layout(cpu_scratch *s, unsigned char *base, const cpu_model *cm,
                     int experts, int n_layers)
{
    carver c = { base, 0 };
    cpu_scratch dummy;
    const int T = cm->threads;
    int xb, xe, xt;
    cpu_xq_layouts(cm->kern, &xb, &xe, &xt);
    if (!s)
        s = &dummy;
    carve(&c, sizeof(cpu_scratch));
    for (int i = 0; i < HD_MLA_HEADS; i++)
        carve_xq(&c, &s->xq_lat[i], HD_MLA_KV_LORA, xb, xe, xt);
    for (int j = 0; j < CPU_NX; j++)
        carve_xq(&c, &s->xq_f[j], HD_MOE_INTER, xb, xe, xt);
    s->logits = carve(&c, (size_t)experts * sizeof(float));
    s->mla_ml = carve(&c, (size_t)T * 2 * HD_MLA_HEADS * sizeof(float));
    s->mla_acc = carve(&c, (size_t)T * HD_MLA_HEADS * HD_MLA_KV_LORA * sizeof(float));
    s->mla_work = carve(&c, (size_t)T * cpu_mla_work(cm->kern) * sizeof(float));
    s->n_ctr = n_layers * CPU_SWEEPS_PER_LAYER;
    s->ctr = carve(&c, (size_t)s->n_ctr * (size_t)T * sizeof(uint64_t));
    s->bar = carve(&c, 64);
    s->th = carve(&c, (size_t)T * sizeof(cpu_thread));
    for (int t = 0; t < T; t++) {
        cpu_thread tmp, *th = s->th ? &s->th[t] : &tmp;
        th->h = carve(&c, HD_HIDDEN * sizeof(float));
        th->x = carve(&c, HD_HIDDEN * sizeof(float));
        th->a = carve(&c, CPU_A * sizeof(float));
        th->qrope = carve(&c, HD_MLA_HEADS * HD_MLA_QK_ROPE * sizeof(float));
        carve_xq(&c, &th->xq, CPU_A, xb, xe, xt);
    }
    s->threads = T;
    return c.used;
}

hd_status cpu_state_init(hd_state *state)
{
    const hd_model *m = state->model;
    const cpu_model *cm = m->backend_ctx;
    size_t bytes = layout(NULL, NULL, cm, m->experts, m->n_layers);
    hd_host_state *h;
    hd_status st = hd_host_state_init(state, bytes);
    if (st != HD_OK)
        return st;
    h = state->impl;
    layout(h->scratch, h->scratch, cm, m->experts, m->n_layers);
    return HD_OK;
}

hd_status cpu_step(const hd_model *model, hd_state *state,
                   const uint16_t *in_bf16, uint16_t *out_bf16)
{
    const cpu_model *cm = model->backend_ctx;
    hd_host_state *hs = state->impl;
    cpu_scratch *s = hs->scratch;
    const size_t pos = state->context;

    memset(s->ctr, 0, (size_t)s->n_ctr * (size_t)s->threads * sizeof(uint64_t));
    memset(s->bar, 0, sizeof *s->bar);
#pragma omp parallel num_threads(s->threads)
    {
        cpu_thread *th = &s->th[0];
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        th = &s->th[t];
        th->t = t;
        th->nt = nt;
        th->ctr = s->ctr;
        th->sweep = 0;
        th->bar = s->bar;
        for (int n = 0; n < HD_HIDDEN; n++)
            th->h[n] = hd_bf16_to_f32(in_bf16[n]);
        for (int i = 0; i < model->n_layers; i++) {
            const hd_layer *L = &model->layers[i];
            const cpu_layer *C = &cm->layers[i];
            cpu_job job;

            ref_rmsnorm(th->h, L->attn_norm, th->x);
            cpu_prepare_x(th->x, HD_HIDDEN, &th->xq);
            if (L->kind == 'K')
                cpu_kda(cm, &L->kda, C, hs->S[L->slot], hs->conv[L->slot], s, th);
            else
                cpu_mla(cm, C, hs->c_kv[L->slot], hs->k_rope[L->slot], pos, s, th);
            job = cpu_job_of(&C->o_proj, 0, &th->xq, 0);
            cpu_gemv_multi(cm->kern, &job, 1, s->sum, cpu_next_ctr(th), th->bar);
            for (int n = 0; n < HD_HIDDEN; n++)
                th->h[n] = hd_bf(th->h[n] + hd_bf(s->sum[n]));
            ref_rmsnorm(th->h, L->moe_norm, th->x);
            cpu_prepare_x(th->x, HD_HIDDEN, &th->xq);
            cpu_moe(cm, &L->moe, C, model->experts, s, th);
        }
        if (t == 0)
            for (int n = 0; n < HD_HIDDEN; n++)
                out_bf16[n] = hd_f32_to_bf16(th->h[n]);
    }
    return HD_OK;
}
