/*
 * Every CUDA driver entry point the library interposes: X(symbol, base name, first CUDA version
 * it serves through cuGetProcAddress, per-thread-stream variant). A(...) rows are further base
 * names served by a symbol listed before (cuGraphInstantiateWithFlags is what
 * "cuGraphInstantiate" means from CUDA 12.0).
 *
 * tests/native/cuda_entry_points.tsv classifies every entry point of cuda.h 13.4 and the test
 * checks it against this list.
 */
#ifndef TESSERA_HOOK_LIST_H
#define TESSERA_HOOK_LIST_H

#define TS_CUDA_HOOKS(X, A)                                                                   \
    /* resolution */                                                                         \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                                        \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)                                     \
    /* queries */                                                                            \
    X(cuMemGetInfo, "cuMemGetInfo", 2000, 0)                                                 \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                                              \
    X(cuDeviceTotalMem, "cuDeviceTotalMem", 2000, 0)                                         \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)                                      \
    /* allocations owned by a context */                                                     \
    X(cuMemAlloc, "cuMemAlloc", 2000, 0)                                                     \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                                                  \
    X(cuMemAllocPitch, "cuMemAllocPitch", 2000, 0)                                           \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)                                        \
    X(cuMemFree, "cuMemFree", 2000, 0)                                                       \
    X(cuMemFree_v2, "cuMemFree", 3020, 0)                                                    \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0)                                       \
    X(cuArrayCreate, "cuArrayCreate", 2000, 0)                                               \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 0)                                            \
    X(cuArray3DCreate, "cuArray3DCreate", 2000, 0)                                           \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0)                                        \
    X(cuArrayDestroy, "cuArrayDestroy", 2000, 0)                                             \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0)                             \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0)                           \
    /* stream-ordered allocation and pools */                                                \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0)                                          \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1)                                     \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0)                          \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1)                     \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0)                                            \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1)                                       \
    X(cuMemPoolCreate, "cuMemPoolCreate", 11020, 0)                                          \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, 0)                                        \
    X(cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020, 0)                                          \
    X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 11020, 0)                              \
    X(cuMemPoolImportFromShareableHandle, "cuMemPoolImportFromShareableHandle", 11020, 0)    \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, 0)                      \
    X(cuDeviceGetMemPool, "cuDeviceGetMemPool", 11020, 0)                                    \
    X(cuDeviceSetMemPool, "cuDeviceSetMemPool", 11020, 0)                                    \
    X(cuMemGetDefaultMemPool, "cuMemGetDefaultMemPool", 13000, 0)                            \
    X(cuMemGetMemPool, "cuMemGetMemPool", 13000, 0)                                          \
    X(cuMemSetMemPool, "cuMemSetMemPool", 13000, 0)                                          \
    /* synchronisation: where pools release their reserve */                                 \
    X(cuCtxSynchronize, "cuCtxSynchronize", 2000, 0)                                         \
    X(cuCtxSynchronize_v2, "cuCtxSynchronize", 13000, 0)                                     \
    X(cuStreamSynchronize, "cuStreamSynchronize", 2000, 0)                                   \
    X(cuStreamSynchronize_ptsz, "cuStreamSynchronize", 7000, 1)                              \
    X(cuEventSynchronize, "cuEventSynchronize", 2000, 0)                                     \
    /* virtual memory management */                                                          \
    X(cuMemCreate, "cuMemCreate", 10020, 0)                                                  \
    X(cuMemRelease, "cuMemRelease", 10020, 0)                                                \
    X(cuMemMap, "cuMemMap", 10020, 0)                                                        \
    X(cuMemUnmap, "cuMemUnmap", 10020, 0)                                                    \
    X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 11000, 0)                  \
    X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020, 0)                \
    X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020, 0)            \
    X(cuMemMapArrayAsync, "cuMemMapArrayAsync", 11010, 0)                                    \
    X(cuMemMapArrayAsync_ptsz, "cuMemMapArrayAsync", 11010, 1)                               \
    X(cuMulticastCreate, "cuMulticastCreate", 12010, 0)                                      \
    X(cuMulticastBindMem, "cuMulticastBindMem", 12010, 0)                                    \
    X(cuMulticastBindMem_v2, "cuMulticastBindMem", 13010, 0)                                 \
    X(cuMulticastBindAddr, "cuMulticastBindAddr", 12010, 0)                                  \
    X(cuMulticastBindAddr_v2, "cuMulticastBindAddr", 13010, 0)                               \
    X(cuMulticastUnbind, "cuMulticastUnbind", 12010, 0)                                      \
    X(cuLogicalEndpointBindMem, "cuLogicalEndpointBindMem", 13030, 0)                        \
    X(cuLogicalEndpointBindAddr, "cuLogicalEndpointBindAddr", 13030, 0)                      \
    /* graph memory */                                                                       \
    X(cuGraphInstantiate, "cuGraphInstantiate", 10000, 0)                                    \
    X(cuGraphInstantiate_v2, "cuGraphInstantiate", 11000, 0)                                 \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040, 0)                  \
    A(cuGraphInstantiateWithFlags, "cuGraphInstantiate", 12000, 0)                           \
    X(cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", 12000, 0)                \
    X(cuGraphInstantiateWithParams_ptsz, "cuGraphInstantiateWithParams", 12000, 1)           \
    X(cuGraphUpload, "cuGraphUpload", 11010, 0)                                              \
    X(cuGraphUpload_ptsz, "cuGraphUpload", 11010, 1)                                         \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", 10000, 0)                                    \
    X(cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", 11040, 0)                                \
    /* contexts */                                                                           \
    X(cuCtxCreate, "cuCtxCreate", 2000, 0)                                                   \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0)                                                \
    X(cuCtxCreate_v3, "cuCtxCreate", 11040, 0)                                               \
    X(cuCtxCreate_v4, "cuCtxCreate", 12050, 0)                                               \
    X(cuCtxDestroy, "cuCtxDestroy", 2000, 0)                                                 \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                                              \
    X(cuCtxAttach, "cuCtxAttach", 2000, 0)                                                   \
    X(cuCtxDetach, "cuCtxDetach", 2000, 0)                                                   \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0)                         \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0)                       \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0)                   \
    X(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, 0)                           \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0)                       \
    X(cuGreenCtxCreate, "cuGreenCtxCreate", 12040, 0)                                        \
    X(cuGreenCtxDestroy, "cuGreenCtxDestroy", 12040, 0)                                      \
    X(cuCtxFromGreenCtx, "cuCtxFromGreenCtx", 12040, 0)                                      \
    X(cuGLCtxCreate, "cuGLCtxCreate", 2000, 0)                                               \
    X(cuGLCtxCreate_v2, "cuGLCtxCreate", 3020, 0)                                            \
    X(cuCtxSetLimit, "cuCtxSetLimit", 3010, 0)                                               \
    X(cuCheckpointProcessRestore, "cuCheckpointProcessRestore", 12080, 0)                    \
    /* launches */                                                                           \
    X(cuLaunchKernel, "cuLaunchKernel", 4000, 0)                                             \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1)                                        \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0)                                        \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)                                   \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0)                       \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1)                  \
    X(cuGraphLaunch, "cuGraphLaunch", 10000, 0)                                              \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)

/* The NVML entry points the library interposes (query.c). */
#define TS_NVML_HOOKS(X)                   \
    X(nvmlDeviceGetMemoryInfo)             \
    X(nvmlDeviceGetMemoryInfo_v2)

#endif
