/* ref_backend.c - the reference backend's entry in the backend table. */
#include "config.h"

#include <stdio.h>

#include "backend.h"
#include "ref.h"
#include "state_host.h"
#include "util.h"

static hd_status ref_probe(char *err, size_t err_size)
{
    (void)err;
    (void)err_size;
    return HD_OK; /* plain C runs everywhere */
}

static hd_status ref_model_init(hd_model *model, char *err, size_t err_size)
{
    (void)err;
    (void)err_size;
    snprintf(model->backend_info, sizeof model->backend_info,
             "ref (scalar C, 1 thread)");
    model->backend_ctx = NULL; /* reads the weights where they are */
    return HD_OK;
}

static void ref_model_free(hd_model *model)
{
    (void)model;
}

/* Scratch: the fixed struct, then capacity + 1 scores and E logits. */
static hd_status ref_state_init(hd_state *state)
{
    size_t extra, bytes;
    hd_status st;
    ref_scratch *s;
    hd_host_state *h;

    if (!hd_add_size(state->capacity, 1 + (size_t)state->model->experts, &extra) ||
        !hd_mul_size(extra, sizeof(float), &extra) ||
        !hd_add_size(sizeof(ref_scratch), extra, &bytes))
        return HD_ERR_OUT_OF_MEMORY;
    st = hd_host_state_init(state, bytes);
    if (st != HD_OK)
        return st;
    h = state->impl;
    s = h->scratch;
    s->scores = (float *)(s + 1);
    s->logits = s->scores + state->capacity + 1;
    return HD_OK;
}

/* One thread streams the weights: measure what one thread can read. */
static hd_status ref_measure_bandwidth(const hd_model *model, double *bytes_per_s)
{
    (void)model;
    return hd_host_read_bandwidth((size_t)1 << 30, 1, 3, bytes_per_s);
}

const hd_backend_ops hd_ref_backend = {
    .kind = HD_BACKEND_REF,
    .name = "ref",
    .probe = ref_probe,
    .model_init = ref_model_init,
    .model_free = ref_model_free,
    .state_init = ref_state_init,
    .state_free = hd_host_state_free,
    .state_reset = hd_host_state_reset,
    .state_read = hd_host_state_read,
    .state_write = hd_host_state_write,
    .step = ref_step,
    .measure_bandwidth = ref_measure_bandwidth,
};
