// Lets the numerics core compile for the host and, unchanged, inside CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define ATTNKIT_HD __host__ __device__ __forceinline__
#else
#define ATTNKIT_HD inline
#endif
