/* synth.h - the deterministic synthetic model of docs/SYNTH.md. */
#ifndef HD_SYNTH_H
#define HD_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "motif.h"

uint32_t hd_synth_lowbias32(uint32_t x);
uint32_t hd_synth_fnv1a32(const char *s);

/* Fills `dst` (hd_motif_tensor_bytes(spec) bytes, bf16 values in host
 * order) with the values of one tensor for `seed`. */
void hd_synth_fill(uint32_t seed, const hd_tensor_spec *spec, void *dst);

/* The SMALL rule for an arbitrary name: count bf16 values of step 2^exp. */
void hd_synth_small(uint32_t seed, const char *name, int exp, size_t count,
                    uint16_t *dst);

#endif /* HD_SYNTH_H */
