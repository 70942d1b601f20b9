/* backend.c - the backend registry and the choice of a backend. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda_module.h"
#include "util.h"

const hd_backend_ops *hd_backend_ops_get(hd_backend kind)
{
    switch (kind) {
    case HD_BACKEND_REF:
        return &hd_ref_backend;
#ifdef HD_HAVE_CPU_BACKEND
    case HD_BACKEND_CPU:
        return &hd_cpu_backend;
#endif
    case HD_BACKEND_CUDA: {
        /* The module when it loads; else a stand-in whose probe says why. */
        const hd_backend_ops *ops = hd_cuda_backend_ops();
        return ops ? ops : &hd_cuda_stub_backend;
    }
    default:
        return NULL; /* not part of this build */
    }
}

const char *hd_backend_name(hd_backend backend)
{
    switch (backend) {
    case HD_BACKEND_DEFAULT: return "default";
    case HD_BACKEND_AUTO: return "auto";
    case HD_BACKEND_REF: return "ref";
    case HD_BACKEND_CPU: return "cpu";
    case HD_BACKEND_CUDA: return "cuda";
    }
    return "unknown";
}

hd_status hd_backend_parse(const char *name, hd_backend *backend)
{
    static const hd_backend all[] = { HD_BACKEND_AUTO, HD_BACKEND_REF,
                                      HD_BACKEND_CPU, HD_BACKEND_CUDA };
    if (!name || !backend)
        return HD_ERR_INVALID_ARGUMENT;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(name, hd_backend_name(all[i])) == 0) {
            *backend = all[i];
            return HD_OK;
        }
    }
    return HD_ERR_INVALID_ARGUMENT;
}

hd_status hd_backend_available(hd_backend backend, char *err, size_t err_size)
{
    const hd_backend_ops *ops;
    if (backend == HD_BACKEND_DEFAULT || backend == HD_BACKEND_AUTO)
        return hd_backend_choose(backend, &ops, NULL, err, err_size);
    ops = hd_backend_ops_get(backend);
    if (!ops) {
        if (backend == HD_BACKEND_CPU || backend == HD_BACKEND_CUDA)
            return hd_fail(err, err_size, HD_ERR_BACKEND_UNAVAILABLE,
                           "backend %s is not part of this build of libhd",
                           hd_backend_name(backend));
        return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                       "unknown backend %d", (int)backend);
    }
    return ops->probe(err, err_size);
}

static const hd_backend auto_preference[] = { HD_BACKEND_CUDA, HD_BACKEND_CPU,
                                              HD_BACKEND_REF };

const hd_backend_ops *hd_backend_auto_next(const hd_backend_ops *after)
{
    size_t n = sizeof auto_preference / sizeof auto_preference[0], i = 0;

    while (i < n && hd_backend_ops_get(auto_preference[i]) != after)
        i++;
    for (i++; i < n; i++) {
        const hd_backend_ops *o = hd_backend_ops_get(auto_preference[i]);
        if (o && o->probe(NULL, 0) == HD_OK)
            return o;
    }
    return NULL;
}

hd_status hd_backend_choose(hd_backend requested, const hd_backend_ops **ops,
                            int *automatic, char *err, size_t err_size)
{
    const hd_backend *preference = auto_preference;
    size_t n = sizeof auto_preference / sizeof auto_preference[0];
    hd_status st;

    *ops = NULL;
    if (automatic)
        *automatic = 0;
    if (requested == HD_BACKEND_DEFAULT) {
        const char *env = getenv("HD_BACKEND");
        requested = HD_BACKEND_AUTO;
        if (env && *env && hd_backend_parse(env, &requested) != HD_OK)
            return hd_fail(err, err_size, HD_ERR_INVALID_ARGUMENT,
                           "HD_BACKEND=\"%.32s\" is not one of auto, ref, cpu, cuda",
                           env);
    }
    if (requested != HD_BACKEND_AUTO) {
        st = hd_backend_available(requested, err, err_size);
        if (st == HD_OK)
            *ops = hd_backend_ops_get(requested);
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        const hd_backend_ops *o = hd_backend_ops_get(preference[i]);
        if (o && o->probe(NULL, 0) == HD_OK) {
            *ops = o;
            if (automatic)
                *automatic = 1;
            return HD_OK;
        }
    }
    return hd_fail(err, err_size, HD_ERR_BACKEND_UNAVAILABLE,
                   "no backend is usable on this machine");
}
