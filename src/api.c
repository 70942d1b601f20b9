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
