/* util.c - error messages and aligned allocation. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef HAVE_SYS_MMAN_H
#include <sys/mman.h>
#endif

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
    if (rounded >= HD_HUGE_BYTES) {
        /* Start on a huge page's boundary and ask for huge pages before
         * the first touch: a step streams its weights (250 MB at E = 256)
         * once, and on 4 KB pages that is a TLB miss every 4 KB.  Where
         * the kernel has no transparent huge pages (or "never"), the
         * advice fails and changes nothing. */
        if (posix_memalign(&p, HD_HUGE_BYTES, rounded) != 0)
            return NULL;
#if defined(HAVE_MADVISE) && defined(MADV_HUGEPAGE)
        (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
    } else if (posix_memalign(&p, 64, rounded) != 0) {
        return NULL;
    }
    memset(p, 0, rounded);
    return p;
}

void hd_free_aligned(void *p)
{
    free(p);
}

#if defined(HAVE_MMAP) && defined(HAVE_SYS_MMAN_H) && defined(MAP_ANONYMOUS)
#define HD_LAZY_MMAP 1
#endif

void *hd_alloc_lazy(size_t bytes)
{
#ifdef HD_LAZY_MMAP
    void *p;
    if (bytes == 0)
        bytes = 1;
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
#else
    return hd_alloc_aligned(bytes);
#endif
}

void hd_free_lazy(void *p, size_t bytes)
{
    if (!p)
        return;
#ifdef HD_LAZY_MMAP
    (void)munmap(p, bytes ? bytes : 1);
#else
    (void)bytes;
    hd_free_aligned(p);
#endif
}
