/* cuda_loader.c - finds, dlopens and checks the CUDA backend module.
 *
 * libhd has no link-time dependency on CUDA: the backend lives in the
 * libtool module hd-cuda.so, found at $HD_CUDA_MODULE (build trees, tests)
 * or else $(pkglibdir)/hd-cuda.so.  The module exports one versioned entry
 * point, hd_cuda_module_v1, which returns its hd_backend_ops after checking
 * the ABI number.  The lookup happens once per process (pthread_once); its
 * outcome, including the reason for a failure, is cached. */
#include "config.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda_module.h"
#include "util.h"

#ifndef HD_PKGLIBDIR
#define HD_PKGLIBDIR "/usr/local/lib/hybrid-decode"
#endif

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const hd_backend_ops *module_ops;
static char load_error[512];

static void load_module(void)
{
    const char *env = getenv("HD_CUDA_MODULE");
    char path[1024];
    void *handle;
    hd_cuda_module_fn entry;
    const hd_backend_ops *ops;
    int abi = 0;

    if (env && *env)
        snprintf(path, sizeof path, "%.1000s", env);
    else
        snprintf(path, sizeof path, "%s/hd-cuda.so", HD_PKGLIBDIR);
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *e = dlerror();
        snprintf(load_error, sizeof load_error,
                 "CUDA module not loadable: %.480s", e ? e : path);
        return;
    }
    *(void **)&entry = dlsym(handle, HD_CUDA_MODULE_ENTRY);
    if (!entry) {
        snprintf(load_error, sizeof load_error,
                 "CUDA module %.400s has no entry point " HD_CUDA_MODULE_ENTRY,
                 path);
        dlclose(handle);
        return;
    }
    ops = entry(HD_CUDA_MODULE_ABI, &abi);
    if (!ops || abi != HD_CUDA_MODULE_ABI) {
        snprintf(load_error, sizeof load_error,
                 "CUDA module %.400s has ABI %d, libhd needs %d", path, abi,
                 HD_CUDA_MODULE_ABI);
        dlclose(handle);
        return;
    }
    /* The module stays loaded for the life of the process. */
    module_ops = ops;
}

const hd_backend_ops *hd_cuda_backend_ops(void)
{
    pthread_once(&load_once, load_module);
    return module_ops;
}

/* probe of the stand-in entry used when the module cannot be loaded. */
static hd_status missing_probe(char *err, size_t err_size)
{
    pthread_once(&load_once, load_module);
    if (module_ops)
        return module_ops->probe(err, err_size);
    return hd_fail(err, err_size, HD_ERR_BACKEND_UNAVAILABLE, "%s",
                   load_error);
}

/* Registered always; every function but probe is only reached through
 * hd_cuda_backend_ops() once probe said HD_OK. */
const hd_backend_ops hd_cuda_stub_backend = {
    .kind = HD_BACKEND_CUDA,
    .name = "cuda",
    .probe = missing_probe,
};
