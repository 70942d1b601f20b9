/* util.h - small internal helpers: error messages, checked sizes, bf16. */
#ifndef HD_UTIL_H
#define HD_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hd.h"

#if defined(__GNUC__)
#define HD_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define HD_PRINTF(f, a)
#endif

/* Writes a formatted one-line message to err (if err && err_size) and
 * returns status, so that callers can `return hd_fail(...)`. */
hd_status hd_fail(char *err, size_t err_size, hd_status status,
                  const char *fmt, ...) HD_PRINTF(4, 5);

/* Overflow-checked size arithmetic: true when the result fits. */
static inline bool hd_mul_size(size_t a, size_t b, size_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}
static inline bool hd_add_size(size_t a, size_t b, size_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}
static inline bool hd_mul_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}
static inline bool hd_add_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}

/* bf16 <-> fp32.  Rounding is to nearest, ties to even; NaN stays a (quiet)
 * NaN of the same sign. */
static inline float hd_bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint16_t hd_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* bf(x) of SEMANTICS.md: round to bf16 and back. */
static inline float hd_bf(float f)
{
    return hd_bf16_to_f32(hd_f32_to_bf16(f));
}
/* True when a bf16 bit pattern is NaN or infinite. */
static inline bool hd_bf16_nonfinite(uint16_t b)
{
    return (b & 0x7f80u) == 0x7f80u;
}

/* Little-endian loads and stores that do not care about alignment. */
static inline uint64_t hd_load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline void hd_store_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Cache-line aligned allocation (zeroed); free with hd_free_aligned.
 * Blocks of HD_HUGE_BYTES or more start on a 2 MiB boundary and are
 * advised to the kernel as huge-page memory (where it has that). */
#define HD_HUGE_BYTES ((size_t)2 << 20)
void *hd_alloc_aligned(size_t bytes);
void hd_free_aligned(void *p);

/* Zeroed, page-aligned memory whose pages the process holds only once
 * they are written (an anonymous mapping; where there is none, an
 * hd_alloc_aligned block, touched whole).  Free with hd_free_lazy and the
 * same size. */
void *hd_alloc_lazy(size_t bytes);
void hd_free_lazy(void *p, size_t bytes);

#endif /* HD_UTIL_H */
