/* state_host.c - host-memory decode state for the ref and cpu backends. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "state_host.h"
#include "util.h"

#define S_FLOATS ((size_t)HD_KDA_HEADS * HD_KDA_HEAD_DIM * HD_KDA_HEAD_DIM)
#define CONV_VALUES ((size_t)3 * 3 * HD_KDA_HEADS * HD_KDA_HEAD_DIM)
#define CONV_ONE ((size_t)3 * HD_KDA_HEADS * HD_KDA_HEAD_DIM)

hd_status hd_host_state_init(hd_state *state, size_t scratch_bytes)
{
    const hd_model *m = state->model;
    hd_host_state *h = calloc(1, sizeof *h);
    size_t cap = state->capacity;

    if (!h)
        return HD_ERR_OUT_OF_MEMORY;
    state->impl = h;
    for (int i = 0; i < m->n_layers; i++) {
        int slot = m->layers[i].slot;
        if (m->layers[i].kind == 'K') {
            h->S[slot] = hd_alloc_aligned(S_FLOATS * sizeof(float));
            h->conv[slot] = hd_alloc_aligned(CONV_VALUES * sizeof(uint16_t));
            if (!h->S[slot] || !h->conv[slot])
                goto fail;
        } else {
            /* Sizes were checked for overflow by hd_state_new. */
            h->c_kv[slot] = hd_alloc_aligned(cap * HD_MLA_KV_LORA * 2);
            h->k_rope[slot] = hd_alloc_aligned(cap * HD_MLA_QK_ROPE * 2);
            if (!h->c_kv[slot] || !h->k_rope[slot])
                goto fail;
        }
    }
    h->scratch = hd_alloc_aligned(scratch_bytes);
    if (!h->scratch)
        goto fail;
    return HD_OK;
fail:
    hd_host_state_free(state);
    return HD_ERR_OUT_OF_MEMORY;
}

void hd_host_state_free(hd_state *state)
{
    hd_host_state *h = state->impl;
    if (!h)
        return;
    for (int i = 0; i < HD_MAX_LAYERS; i++) {
        hd_free_aligned(h->S[i]);
        hd_free_aligned(h->conv[i]);
        hd_free_aligned(h->c_kv[i]);
        hd_free_aligned(h->k_rope[i]);
    }
    hd_free_aligned(h->scratch);
    free(h);
    state->impl = NULL;
}

hd_status hd_host_state_reset(hd_state *state)
{
    hd_host_state *h = state->impl;
    for (int i = 0; i < state->model->n_kda; i++) {
        memset(h->S[i], 0, S_FLOATS * sizeof(float));
        memset(h->conv[i], 0, CONV_VALUES * sizeof(uint16_t));
    }
    /* The MLA rows beyond the context are never read: no need to clear. */
    return HD_OK;
}

/* Where a tensor lives and how many bytes it has for `rows` MLA rows. */
static void *locate(const hd_state *state, int layer, hd_state_tensor which,
                    size_t rows, size_t *bytes)
{
    hd_host_state *h = state->impl;
    int slot = state->model->layers[layer].slot;
    switch (which) {
    case HD_STATE_S:
        *bytes = S_FLOATS * sizeof(float);
        return h->S[slot];
    case HD_STATE_CONV_Q:
    case HD_STATE_CONV_K:
    case HD_STATE_CONV_V:
        *bytes = CONV_ONE * sizeof(uint16_t);
        return h->conv[slot] + (size_t)(which - HD_STATE_CONV_Q) * CONV_ONE;
    case HD_STATE_C_KV:
        *bytes = rows * HD_MLA_KV_LORA * 2;
        return h->c_kv[slot];
    case HD_STATE_K_ROPE:
        *bytes = rows * HD_MLA_QK_ROPE * 2;
        return h->k_rope[slot];
    }
    return NULL;
}

hd_status hd_host_state_read(const hd_state *state, int layer,
                             hd_state_tensor which, size_t rows, void *dst)
{
    size_t bytes;
    void *p = locate(state, layer, which, rows, &bytes);
    if (!p)
        return HD_ERR_INTERNAL;
    memcpy(dst, p, bytes);
    return HD_OK;
}

hd_status hd_host_state_write(hd_state *state, int layer,
                              hd_state_tensor which, size_t rows,
                              const void *src)
{
    size_t bytes;
    void *p = locate(state, layer, which, rows, &bytes);
    if (!p)
        return HD_ERR_INTERNAL;
    memcpy(p, src, bytes);
    return HD_OK;
}
