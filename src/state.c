/* state.c - the public state API: validation, then the backend. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "util.h"

#define S_BYTES ((size_t)HD_KDA_HEADS * HD_KDA_HEAD_DIM * HD_KDA_HEAD_DIM * 4)
#define CONV_BYTES ((size_t)3 * HD_KDA_HEADS * HD_KDA_HEAD_DIM * 2)

static int state_ok(const hd_state *s)
{
    return s && s->magic == HD_STATE_MAGIC;
}

hd_status hd_state_new(const hd_model *model, size_t capacity,
                       hd_state **state)
{
    hd_state *s;
    hd_status st;
    size_t row_bytes = (HD_MLA_KV_LORA + HD_MLA_QK_ROPE) * 2, total;

    if (!state)
        return HD_ERR_INVALID_ARGUMENT;
    *state = NULL;
    if (!model || model->magic != HD_MODEL_MAGIC)
        return HD_ERR_INVALID_ARGUMENT;
    /* The caches of every MLA layer must be addressable. */
    if (!hd_mul_size(capacity, row_bytes, &total) ||
        !hd_mul_size(total, (size_t)(model->n_mla ? model->n_mla : 1), &total) ||
        capacity > SIZE_MAX / 8)
        return HD_ERR_OUT_OF_MEMORY;
    s = calloc(1, sizeof *s);
    if (!s)
        return HD_ERR_OUT_OF_MEMORY;
    s->magic = HD_STATE_MAGIC;
    s->model = model;
    s->capacity = capacity;
    st = model->backend->state_init(s);
    if (st != HD_OK) {
        free(s);
        return st;
    }
    *state = s;
    return HD_OK;
}

void hd_state_free(hd_state *state)
{
    if (!state_ok(state))
        return;
    state->model->backend->state_free(state);
    state->magic = 0;
    free(state);
}

hd_status hd_state_reset(hd_state *state)
{
    hd_status st;
    if (!state_ok(state))
        return HD_ERR_INVALID_ARGUMENT;
    st = state->model->backend->state_reset(state);
    if (st == HD_OK)
        state->context = 0;
    return st;
}

size_t hd_state_context(const hd_state *state)
{
    return state_ok(state) ? state->context : 0;
}

size_t hd_state_capacity(const hd_state *state)
{
    return state_ok(state) ? state->capacity : 0;
}

/* Size of a tensor for `rows` MLA rows; also checks layer and kind. */
static hd_status tensor_bytes(const hd_state *s, int layer,
                              hd_state_tensor which, size_t rows,
                              size_t *bytes)
{
    const hd_model *m;
    char kind;
    if (!state_ok(s))
        return HD_ERR_INVALID_ARGUMENT;
    m = s->model;
    if (layer < 0 || layer >= m->n_layers)
        return HD_ERR_INVALID_ARGUMENT;
    kind = m->layers[layer].kind;
    switch (which) {
    case HD_STATE_S:
        *bytes = S_BYTES;
        return kind == 'K' ? HD_OK : HD_ERR_INVALID_ARGUMENT;
    case HD_STATE_CONV_Q:
    case HD_STATE_CONV_K:
    case HD_STATE_CONV_V:
        *bytes = CONV_BYTES;
        return kind == 'K' ? HD_OK : HD_ERR_INVALID_ARGUMENT;
    case HD_STATE_C_KV:
        *bytes = rows * HD_MLA_KV_LORA * 2; /* rows <= capacity: no overflow */
        return kind == 'M' ? HD_OK : HD_ERR_INVALID_ARGUMENT;
    case HD_STATE_K_ROPE:
        *bytes = rows * HD_MLA_QK_ROPE * 2;
        return kind == 'M' ? HD_OK : HD_ERR_INVALID_ARGUMENT;
    }
    return HD_ERR_INVALID_ARGUMENT;
}

hd_status hd_state_tensor_bytes(const hd_state *state, int layer,
                                hd_state_tensor which, size_t *bytes)
{
    size_t b = 0;
    hd_status st;
    if (!bytes)
        return HD_ERR_INVALID_ARGUMENT;
    st = tensor_bytes(state, layer, which, state_ok(state) ? state->context : 0, &b);
    if (st == HD_OK)
        *bytes = b;
    return st;
}

/* The checks export and import share: layer and kind, the exact byte size,
 * the buffer.  HD_OK with *copy = 0 when there is nothing to copy. */
static hd_status check_transfer(const hd_state *state, int layer,
                                hd_state_tensor which, const void *buf,
                                size_t bytes, int *copy)
{
    size_t want;
    hd_status st = tensor_bytes(state, layer, which,
                                state_ok(state) ? state->context : 0, &want);
    *copy = 0;
    if (st != HD_OK)
        return st;
    if (bytes != want)
        return HD_ERR_SIZE_MISMATCH;
    if (bytes == 0)
        return HD_OK;
    if (!buf)
        return HD_ERR_INVALID_ARGUMENT;
    *copy = 1;
    return HD_OK;
}

hd_status hd_state_export(const hd_state *state, int layer,
                          hd_state_tensor which, void *dst, size_t bytes)
{
    int copy;
    hd_status st = check_transfer(state, layer, which, dst, bytes, &copy);
    if (st != HD_OK || !copy)
        return st;
    return state->model->backend->state_read(state, layer, which,
                                             state->context, dst);
}

hd_status hd_state_import(hd_state *state, int layer, hd_state_tensor which,
                          const void *src, size_t bytes)
{
    int copy;
    hd_status st = check_transfer(state, layer, which, src, bytes, &copy);
    if (st != HD_OK || !copy)
        return st;
    return state->model->backend->state_write(state, layer, which,
                                              state->context, src);
}

hd_status hd_state_prefill(hd_state *state, size_t rows, const uint16_t *c_kv,
                           const uint16_t *k_rope)
{
    const hd_model *m;
    hd_status st;
    int slot = 0;

    if (!state_ok(state))
        return HD_ERR_INVALID_ARGUMENT;
    m = state->model;
    if (rows > state->capacity)
        return HD_ERR_CACHE_FULL;
    if (rows > 0 && m->n_mla > 0 && (!c_kv || !k_rope))
        return HD_ERR_INVALID_ARGUMENT;
    for (int i = 0; i < m->n_layers && rows > 0; i++) {
        if (m->layers[i].kind != 'M')
            continue;
        st = m->backend->state_write(state, i, HD_STATE_C_KV, rows,
                                     c_kv + (size_t)slot * rows * HD_MLA_KV_LORA);
        if (st == HD_OK)
            st = m->backend->state_write(state, i, HD_STATE_K_ROPE, rows,
                                         k_rope + (size_t)slot * rows * HD_MLA_QK_ROPE);
        if (st != HD_OK)
            return st;
        slot++;
    }
    state->context = rows;
    return HD_OK;
}
