// A copy of core/rng.h's hash_uniform that nvcc can compile for the device (and g++ for the host),
// so dropout masks on the GPU are bit-identical to the CPU's. test_cuda checks the two agree.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define QLORA_HD __host__ __device__ __forceinline__
#else
#define QLORA_HD inline
#endif

namespace qlora::cuda {

// Same arithmetic as qlora::hash_uniform: splitmix64's finalizer over (seed, a, b), then the top
// 24 bits as a float in [0, 1). Both steps are exact integer/power-of-two operations.
QLORA_HD float hash_uniform_hd(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t x = seed ^ (a * 0x9e3779b97f4a7c15ull) ^ (b * 0xc2b2ae3d27d4eb4full);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return float(x >> 40) * (1.0f / 16777216.0f);
}

}  // namespace qlora::cuda
