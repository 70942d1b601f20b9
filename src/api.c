/* api.c - versions, status strings, options, model queries and hd_step. */
#include "config.h"

#include <string.h>

#include "backend.h"
#include "util.h"

const char *hd_version_string(void)
{
    return HD_VERSION_STRING;
}

int hd_version_number(void)
{
    return HD_VERSION_NUMBER;
}

const char *hd_status_string(hd_status status)
{
    switch (status) {
    case HD_OK: return "success";
    case HD_ERR_INVALID_ARGUMENT: return "invalid argument";
    case HD_ERR_OUT_OF_MEMORY: return "out of memory";
    case HD_ERR_IO: return "input/output error";
    case HD_ERR_FORMAT: return "malformed safetensors file";
    case HD_ERR_MODEL: return "not a model of the motif";
    case HD_ERR_BACKEND_UNAVAILABLE: return "backend not available";
    case HD_ERR_CACHE_FULL: return "MLA cache full";
    case HD_ERR_SIZE_MISMATCH: return "buffer size does not match the tensor";
    case HD_ERR_STATE_MISMATCH: return "state belongs to another model";
    case HD_ERR_NONFINITE: return "input holds NaN or infinity";
    case HD_ERR_BACKEND: return "backend failure";
    case HD_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

void hd_options_init(hd_options *options)
{
    if (!options)
        return;
    memset(options, 0, sizeof *options);
    options->struct_size = sizeof *options;
    options->backend = HD_BACKEND_DEFAULT;
}

static int model_ok(const hd_model *m)
{
    return m && m->magic == HD_MODEL_MAGIC;
}

hd_backend hd_model_backend(const hd_model *model)
{
    return model_ok(model) ? model->backend->kind : HD_BACKEND_DEFAULT;
}

const char *hd_model_backend_info(const hd_model *model)
{
    return model_ok(model) ? model->backend_info : "";
}

int hd_model_experts(const hd_model *model)
{
    return model_ok(model) ? model->experts : 0;
}

int hd_model_layers(const hd_model *model)
{
    return model_ok(model) ? model->n_layers : 0;
}

const char *hd_model_pattern(const hd_model *model)
{
    return model_ok(model) ? model->pattern : "";
}

uint64_t hd_model_weight_bytes(const hd_model *model)
{
    return model_ok(model) ? model->weight_bytes : 0;
}

static uint64_t qlinear_bytes(const hd_qlinear *q)
{
    /* One member: packed nibbles + bf16 scales and zeros per 128 rows. */
    uint64_t n = (uint64_t)q->n, k = (uint64_t)q->k;
    return k / 2 * n + 2 * (k / 128 * n * 2);
}

uint64_t hd_model_step_bytes(const hd_model *model, size_t context)
{
    const uint64_t D = HD_HIDDEN, A = HD_KDA_HEADS * HD_KDA_HEAD_DIM;
    const uint64_t mla_row = (HD_MLA_KV_LORA + HD_MLA_QK_ROPE) * 2;
    uint64_t total = 0;

    if (!model_ok(model))
        return 0;
    for (int i = 0; i < model->n_layers; i++) {
        const hd_layer *L = &model->layers[i];
        const hd_moe_weights *m = &L->moe;
        total += 2 * D * 2; /* attn_norm, moe_norm */
        if (L->kind == 'K') {
            const hd_kda_weights *w = &L->kda;
            total += qlinear_bytes(&w->q_proj) + qlinear_bytes(&w->k_proj) +
                     qlinear_bytes(&w->v_proj) + qlinear_bytes(&w->g_proj) +
                     qlinear_bytes(&w->o_proj);
            total += HD_KDA_HEADS * D * 2 + 3 * A * HD_KDA_CONV * 2;
            total += 2 * (uint64_t)HD_KDA_HEADS * HD_KDA_HEAD_DIM * HD_KDA_HEAD_DIM * 4;
            total += 2 * 3 * 3 * A * 2; /* conv caches read and written */
        } else {
            const hd_mla_weights *w = &L->mla;
            total += qlinear_bytes(&w->q_proj) + qlinear_bytes(&w->kv_a) +
                     qlinear_bytes(&w->kv_b) + qlinear_bytes(&w->o_proj);
            total += ((uint64_t)context + 2) * mla_row; /* read L+1, write 1 */
        }
        total += (uint64_t)model->experts * D * 2; /* router */
        total += (HD_MOE_TOPK + 1) * (qlinear_bytes(&m->gate) +
                                      qlinear_bytes(&m->up) +
                                      qlinear_bytes(&m->down));
    }
    return total;
}

hd_status hd_model_measure_bandwidth(const hd_model *model,
                                     double *bytes_per_second)
{
    if (!model_ok(model) || !bytes_per_second)
        return HD_ERR_INVALID_ARGUMENT;
    return model->backend->measure_bandwidth(model, bytes_per_second);
}

hd_status hd_step(const hd_model *model, hd_state *state,
                  const uint16_t *in_bf16, uint16_t *out_bf16)
{
    hd_status st;

    if (!model_ok(model) || !state || state->magic != HD_STATE_MAGIC ||
        !in_bf16 || !out_bf16)
        return HD_ERR_INVALID_ARGUMENT;
    if (state->model != model)
        return HD_ERR_STATE_MISMATCH;
    if (model->n_mla > 0 && state->context >= state->capacity)
        return HD_ERR_CACHE_FULL;
    for (int i = 0; i < HD_HIDDEN; i++)
        if (hd_bf16_nonfinite(in_bf16[i]))
            return HD_ERR_NONFINITE;
    st = model->backend->step(model, state, in_bf16, out_bf16);
    if (st == HD_OK)
        state->context++;
    return st;
}
