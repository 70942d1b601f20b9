/* motif.h - the tensors a model of the motif has, for a pattern and E.
 *
 * One table drives everything that depends on tensor names: the synthetic
 * model (the value rule of each tensor), loading (expected dtype and shape)
 * and binding (where the model keeps the pointer). */
#ifndef HD_MOTIF_H
#define HD_MOTIF_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* SYNTH.md's value rules. */
typedef enum hd_rule {
    HD_RULE_BYTE,  /* u & 255                                   */
    HD_RULE_SCALE, /* bf16 bits ((127 + e) << 7) | (u & 127)     */
    HD_RULE_ZERO,  /* bf16 of 7 + 0.5 * (u & 3)                 */
    HD_RULE_SMALL, /* bf16 of ((u & 255) - 128) * 2^e           */
    HD_RULE_NORM   /* bf16 of 1 + ((u & 15) - 8) / 64           */
} hd_rule;

typedef struct hd_tensor_spec {
    char name[96];
    hd_dtype dtype;
    int ndim;
    uint64_t shape[3];
    hd_rule rule;
    int exp;                  /* e of the SCALE and SMALL rules */
    const uint8_t **u8_slot;  /* where the model binds a U8 tensor   */
    const uint16_t **bf16_slot; /* where the model binds a BF16 tensor */
} hd_tensor_spec;

/* Tensors of one layer of each kind, and of a whole pattern. */
#define HD_KDA_LAYER_TENSORS 38
#define HD_MLA_LAYER_TENSORS 33
size_t hd_motif_tensor_count(const char *pattern);

/* Checks a pattern: 1..HD_MAX_LAYERS letters, each 'K' or 'M'. */
int hd_motif_pattern_ok(const char *pattern);

/* Sets up model->layers (kinds, slots, linear-map sizes) from
 * model->pattern and model->experts, and fills specs[hd_motif_tensor_count]
 * with the expected tensors, their rules and their binding slots. */
void hd_motif_layout(hd_model *model, hd_tensor_spec *specs);

/* Bytes of a tensor of the given spec (dtype size times elements). */
uint64_t hd_motif_tensor_bytes(const hd_tensor_spec *spec);

#endif /* HD_MOTIF_H */
