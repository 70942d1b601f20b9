/* cpu_backend.c - the CPU backend's entry in the backend table: choice of
 * kernels and threads, repacking of the weights at model creation. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "state_host.h"
#include "util.h"

static hd_status cpu_probe(char *err, size_t err_size)
{
    cpu_isa isa;
    return cpu_choose_isa(&isa, err, err_size);
}

static void cpu_layer_free(cpu_layer *C)
{
    cpu_qmat_free(&C->in_proj);
    cpu_qmat_free(&C->o_proj);
    cpu_qmat_free(&C->wv);
    cpu_qmat_free(&C->gate_up);
    cpu_qmat_free(&C->down);
    cpu_qmat_free(&C->s_gate_up);
    cpu_qmat_free(&C->s_down);
    free(C->wk_q);
    free(C->wk_sz);
}

static void cpu_model_free(hd_model *model)
{
    cpu_model *cm = model->backend_ctx;
    if (!cm)
        return;
    for (int i = 0; i < HD_MAX_LAYERS; i++)
        cpu_layer_free(&cm->layers[i]);
    free(cm);
    model->backend_ctx = NULL;
}

static hd_status alloc_layer(cpu_layer *C, const hd_layer *L, int E, cpu_layout layout)
{
    hd_status st = HD_OK;
#define TRY(x) do { if ((st = (x)) != HD_OK) return st; } while (0)
    if (L->kind == 'K') {
        TRY(cpu_qmat_alloc(&C->in_proj, HD_HIDDEN, 4 * CPU_A, 1, layout));
        TRY(cpu_qmat_alloc(&C->o_proj, CPU_A, HD_HIDDEN, 1, layout));
    } else {
        TRY(cpu_qmat_alloc(&C->in_proj, HD_HIDDEN, CPU_MLA_QN + CPU_MLA_KV, 1, layout));
        TRY(cpu_qmat_alloc(&C->o_proj, CPU_A, HD_HIDDEN, 1, layout));
        TRY(cpu_qmat_alloc(&C->wv, HD_MLA_KV_LORA, HD_MLA_V_HEAD, HD_MLA_HEADS, layout));
        C->wk_q = malloc(HD_MLA_HEADS * CPU_WK_HEAD_Q);
        C->wk_sz = malloc(HD_MLA_HEADS * CPU_WK_HEAD_SZ * sizeof *C->wk_sz);
        if (!C->wk_q || !C->wk_sz)
            return HD_ERR_OUT_OF_MEMORY;
    }
    TRY(cpu_qmat_alloc(&C->gate_up, HD_HIDDEN, 2 * HD_MOE_INTER, E, layout));
    TRY(cpu_qmat_alloc(&C->down, HD_MOE_INTER, HD_HIDDEN, E, layout));
    TRY(cpu_qmat_alloc(&C->s_gate_up, HD_HIDDEN, 2 * HD_MOE_INTER, 1, layout));
    TRY(cpu_qmat_alloc(&C->s_down, HD_MOE_INTER, HD_HIDDEN, 1, layout));
#undef TRY
    return st;
}

/* Every repacking job of a layer: index < jobs_of(L, E). */
static int jobs_of(const hd_layer *L, int E)
{
    return (L->kind == 'K' ? 5 : 2 + 3 + HD_MLA_HEADS) + 2 * E + 2;
}

static void repack_job(cpu_layer *C, const hd_layer *L, int E, int j)
{
    const hd_moe_weights *mw = &L->moe;
    if (j >= 2 * E + 2) { /* attention */
        j -= 2 * E + 2;
        if (L->kind == 'K') {
            const hd_qlinear *p[4] = { &L->kda.q_proj, &L->kda.k_proj,
                                       &L->kda.v_proj, &L->kda.g_proj };
            if (j < 4)
                cpu_repack_part(&C->in_proj, 0, j * CPU_A, p[j], 0, 0, CPU_A);
            else if (j == 4)
                cpu_repack_part(&C->o_proj, 0, 0, &L->kda.o_proj, 0, 0, HD_HIDDEN);
            return;
        }
        const hd_mla_weights *w = &L->mla;
        if (j == 0)
            cpu_repack_part(&C->in_proj, 0, 0, &w->q_proj, 0, 0, CPU_MLA_QN);
        else if (j == 1)
            cpu_repack_part(&C->in_proj, 0, CPU_MLA_QN, &w->kv_a, 0, 0, CPU_MLA_KV);
        else if (j == 2)
            cpu_repack_part(&C->o_proj, 0, 0, &w->o_proj, 0, 0, HD_HIDDEN);
        else if (j == 3)
            cpu_pack_wk(C->wk_q, C->wk_sz, &w->kv_b);
        else if (j == 4)
            return;
        else {
            int h = j - 5;
            cpu_repack_part(&C->wv, h, 0, &w->kv_b, 0,
                            h * 256 + HD_MLA_QK_NOPE, HD_MLA_V_HEAD);
        }
        return;
    }
    if (j < E) {
        cpu_repack_part(&C->gate_up, j, 0, &mw->gate, j, 0, HD_MOE_INTER);
        cpu_repack_part(&C->gate_up, j, HD_MOE_INTER, &mw->up, j, 0, HD_MOE_INTER);
    } else if (j < 2 * E) {
        cpu_repack_part(&C->down, j - E, 0, &mw->down, j - E, 0, HD_HIDDEN);
    } else if (j == 2 * E) {
        cpu_repack_part(&C->s_gate_up, 0, 0, &mw->s_gate, 0, 0, HD_MOE_INTER);
        cpu_repack_part(&C->s_gate_up, 0, HD_MOE_INTER, &mw->s_up, 0, 0, HD_MOE_INTER);
    } else {
        cpu_repack_part(&C->s_down, 0, 0, &mw->s_down, 0, 0, HD_HIDDEN);
    }
}

static hd_status cpu_model_init(hd_model *model, char *err, size_t err_size)
{
    cpu_model *cm;
    cpu_isa isa;
    hd_status st = cpu_choose_isa(&isa, err, err_size);
    const int E = model->experts;

    if (st != HD_OK)
        return st;
    cm = calloc(1, sizeof *cm);
    if (!cm)
        return HD_ERR_OUT_OF_MEMORY;
    model->backend_ctx = cm;
    cm->isa = isa;
    cm->kern = cpu_kernels_for(isa);
    cm->threads = cpu_resolve_threads(model->threads);
    for (int i = 0; i < model->n_layers; i++) {
        st = alloc_layer(&cm->layers[i], &model->layers[i], E, cm->kern->layout);
        if (st != HD_OK) {
            cpu_model_free(model);
            return hd_fail(err, err_size, st,
                           "cpu backend: no memory for the repacked weights");
        }
    }
    for (int i = 0; i < model->n_layers; i++) {
        const int n = jobs_of(&model->layers[i], E);
        cpu_layer *C = &cm->layers[i];
        const hd_layer *L = &model->layers[i];
        /* a synthetic model's int4 matrices are made here, a layer at a
         * time (none of them exist before) */
        hd_model_acquire_layer(model, i);
#pragma omp parallel for schedule(dynamic, 1) num_threads(cm->threads)
        for (int j = 0; j < n; j++)
            repack_job(C, L, E, j);
        /* layer i's int4 matrices are all in the copies now: given back
         * layer by layer, so that loading holds one layer's twice at
         * most, not the model's */
        hd_model_release_layer(model, i);
    }
    snprintf(model->backend_info, sizeof model->backend_info,
             "cpu (%s, %d thread%s)", cm->kern->name, cm->threads,
             cm->threads == 1 ? "" : "s");
    return HD_OK;
}

static hd_status cpu_measure_bandwidth(const hd_model *model, double *bytes_per_s)
{
    const cpu_model *cm = model->backend_ctx;
    return hd_host_read_bandwidth((size_t)1 << 30, cm->threads, 3, bytes_per_s);
}

const hd_backend_ops hd_cpu_backend = {
    .kind = HD_BACKEND_CPU,
    .name = "cpu",
    .probe = cpu_probe,
    .model_init = cpu_model_init,
    .model_free = cpu_model_free,
    .state_init = cpu_state_init,
    .state_free = hd_host_state_free,
    .state_reset = hd_host_state_reset,
    .state_read = hd_host_state_read,
    .state_write = hd_host_state_write,
    .step = cpu_step,
    .measure_bandwidth = cpu_measure_bandwidth,
};
