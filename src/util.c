/* util.c - error messages and aligned allocation. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "util.h"

hd_status hd_fail(char *err, size_t err_size, hd_status status,
                  const char *fmt, ...)
{
    if (err && err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return status;
}

void *hd_alloc_aligned(size_t bytes)
{
    void *p = NULL;
    size_t rounded;
    if (bytes == 0)
        bytes = 1;
    /* Round up to whole cache lines so vector loops may read a full line. */
    if (!hd_add_size(bytes, 63, &rounded))
        return NULL;
    rounded &= ~(size_t)63;
    if (posix_memalign(&p, 64, rounded) != 0)
        return NULL;
    memset(p, 0, rounded);
    return p;
}

void hd_free_aligned(void *p)
{
    free(p);
}
