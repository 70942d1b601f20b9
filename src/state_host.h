/* state_host.h - decode state in host memory, shared by the ref and cpu
 * backends: the seed's layout, one allocation per tensor, made once. */
#ifndef HD_STATE_HOST_H
#define HD_STATE_HOST_H

#include "backend.h"

typedef struct hd_host_state {
    float *S[HD_MAX_LAYERS];        /* by KDA slot: [32][128 k][128 v]   */
    uint16_t *conv[HD_MAX_LAYERS];  /* by KDA slot: [3 (q,k,v)][3][4096] */
    uint16_t *c_kv[HD_MAX_LAYERS];  /* by MLA slot: [capacity][512]      */
    uint16_t *k_rope[HD_MAX_LAYERS];/* by MLA slot: [capacity][64]       */
    void *scratch;                  /* the backend's per-state work memory */
} hd_host_state;

/* Allocates the tensors (zeroed) and `scratch_bytes` of scratch. */
hd_status hd_host_state_init(hd_state *state, size_t scratch_bytes);
void hd_host_state_free(hd_state *state);
hd_status hd_host_state_reset(hd_state *state);
hd_status hd_host_state_read(const hd_state *state, int layer,
                             hd_state_tensor which, size_t rows, void *dst);
hd_status hd_host_state_write(hd_state *state, int layer,
                              hd_state_tensor which, size_t rows,
                              const void *src);

#endif /* HD_STATE_HOST_H */
