// The AdamW update loop, vectorized per x86-64 level. Built with -ffp-contract=off (CMakeLists.txt):
// only the explicit std::fma calls fuse, as in ATen's kernel, so every level gives torch's bits.
#include <cmath>

#include "backend/cpu/cpu_simd.h"

namespace qlora::cpu {

QLORA_SIMD_CLONES
void adamw_row(float* p, const float* g, float* m, float* v, int64_t n, const AdamwScalars& s) {
  for (int64_t i = 0; i < n; i++) {
    float pi = p[i] * s.decay;
    const float gi = g[i];
    const float mi = s.small_w ? std::fma(s.w1, gi - m[i], m[i]) : std::fma(s.w1 - 1.0f, gi - m[i], gi);
    const float vi = std::fma(s.c2 * gi, gi, v[i] * s.b2f);
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    pi = pi + s.neg_step_size * mi / denom;
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace qlora::cpu
