/* Internal to cuda/: programmatic dependent launch (PDL, sm_90 and later).
 *
 * A kernel launched with pdl_launch may be scheduled while the kernel before it on the stream
 * still runs: as soon as every block of that kernel has called pdl_trigger (or exited). Before
 * pdl_wait it may only read what no kernel still running writes (weights, and what kernels before
 * that one wrote) and write nothing; pdl_wait returns when the kernel before it has completed and
 * its writes are visible. A GEMV that holds its whole share of the weights in registers before
 * the wait overlaps their loads with the kernel that makes its input (tests/gpu/bench_pdl: a chain
 * of small GEMV-like kernels in a graph, 4.1 -> 1.9 us a kernel of 2 MB on an H100; the wait first
 * gained nothing, and a sliver of the share before it gained nothing on the peer model's long rows,
 * bench/RESULTS.md session 22). pdl_trigger in a kernel that the next one does not follow with
 * pdl_launch changes nothing; pdl_wait in a kernel launched without it returns at once. */
#ifndef G5_CUDA_PDL_CUH
#define G5_CUDA_PDL_CUH

#include <cuda_runtime.h>

namespace cuk {

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* kern<<<grid, block, smem, st>>>(args...) with the programmatic stream serialization attribute. */
template <typename... KArgs, typename... Args>
static inline cudaError_t pdl_launch(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                     Args... args) {
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<KArgs>(args)...);
}

} // namespace cuk

#endif
