/* cuda_module.h - the interface between libhd and its CUDA module
 * (hd-cuda.so).  Plain C, shared by src/cuda_loader.c and src/cuda/. */
#ifndef HD_CUDA_MODULE_H
#define HD_CUDA_MODULE_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever hd_backend_ops, hd_model, hd_state or hd_layer change. */
#define HD_CUDA_MODULE_ABI 1
#define HD_CUDA_MODULE_ENTRY "hd_cuda_module_v1"

/* The module's entry point: given the ABI libhd was built with, stores the
 * module's ABI in *abi and returns its ops (NULL when they differ). */
typedef const hd_backend_ops *(*hd_cuda_module_fn)(int libhd_abi, int *abi);

/* libhd side: the module's ops, or NULL when it cannot be loaded. */
const hd_backend_ops *hd_cuda_backend_ops(void);
extern const hd_backend_ops hd_cuda_stub_backend;

#ifdef __cplusplus
}
#endif

#endif /* HD_CUDA_MODULE_H */
