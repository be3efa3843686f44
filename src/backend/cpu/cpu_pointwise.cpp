// CPU elementwise activations: SwiGLU and inverted dropout, forward and backward.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_simd.h"
#include "core/error.h"
#include "core/rng.h"

namespace qlora {

// Elements per parallel work item of the elementwise ops.
static constexpr int64_t kChunk = 4096;

void CpuBackend::swiglu_fwd(const SwigluFwdArgs& a) {
  const char* op = "swiglu_fwd";
  cpu::check_dim(op, "n", a.n);
  cpu::check_f32(op, "out", a.out, a.n);
  cpu::check_f32(op, "gate", a.gate, a.n);
  cpu::check_f32(op, "up", a.up, a.n);
  float* out = a.out.f32();           // (N,F)
  const float* gate = a.gate.f32();   // (N,F)
  const float* up = a.up.f32();       // (N,F)
#pragma omp parallel for schedule(static) if (a.n > cpu::kParallelMin)
  for (int64_t i = 0; i < a.n; i += kChunk) {
    const int64_t m = std::min(kChunk, a.n - i);
    if (a.act == Activation::Silu) cpu::swiglu_fwd_row(out + i, gate + i, up + i, m);
    else if (a.act == Activation::GeluTanh) cpu::geglu_fwd_row(out + i, gate + i, up + i, m);
    else
      for (int64_t j = i; j < i + m; j++) out[j] = clamped_swiglu(gate[j], up[j], a.clamp);
  }
}

void CpuBackend::swiglu_bwd(const SwigluBwdArgs& a) {
  const char* op = "swiglu_bwd";
  cpu::check_dim(op, "n", a.n);
  cpu::check_f32(op, "dgate", a.dgate, a.n);
  cpu::check_f32(op, "dup", a.dup, a.n);
  cpu::check_f32(op, "dout", a.dout, a.n);
  cpu::check_f32(op, "gate", a.gate, a.n);
  cpu::check_f32(op, "up", a.up, a.n);
  float* dgate = a.dgate.f32();      // (N,F)
  float* dup = a.dup.f32();          // (N,F)
  const float* dout = a.dout.f32();  // (N,F)
  const float* gate = a.gate.f32();  // (N,F)
  const float* up = a.up.f32();      // (N,F)
  // Each element is read before either write, so dgate/dup may alias gate/up/dout.
#pragma omp parallel for schedule(static) if (a.n > cpu::kParallelMin)
  for (int64_t i = 0; i < a.n; i += kChunk) {
    const int64_t m = std::min(kChunk, a.n - i);
    if (a.act == Activation::Silu) cpu::swiglu_bwd_row(dgate + i, dup + i, dout + i, gate + i, up + i, m);
    else if (a.act == Activation::GeluTanh) cpu::geglu_bwd_row(dgate + i, dup + i, dout + i, gate + i, up + i, m);
    else
      for (int64_t j = i; j < i + m; j++) {
        float dg, du;
        clamped_swiglu_bwd(dout[j], gate[j], up[j], a.clamp, dg, du);
        dgate[j] = dg, dup[j] = du;
      }
  }
}

// out = x * keep(i) / (1-p); the same (seed, stream) gives the same mask in fwd and bwd.
static void dropout_apply(const char* op, const DropoutArgs& a) {
  cpu::check_dim(op, "n", a.n);
  cpu::check_f32(op, "out", a.out, a.n);
  cpu::check_f32(op, "x", a.x, a.n);
  if (!(a.p >= 0.0f && a.p <= 1.0f))
    fail(ErrorKind::Config, std::string("cpu op ") + op + ", argument 'p'",
         "dropout probability " + std::to_string(a.p) + " is outside [0, 1]",
         "lora_dropout must be in [0, 1)");
  float* out = a.out.f32();
  const float* x = a.x.f32();
  if (a.p == 0.0f) {
    if (out != x) std::copy_n(x, a.n, out);
    return;
  }
  // p == 1 drops everything; 1/(1-p) would be inf and 0*inf NaN, so it gets its own branch.
  const float keep_scale = a.p < 1.0f ? 1.0f / (1.0f - a.p) : 0.0f;
#pragma omp parallel for schedule(static) if (a.n > cpu::kParallelMin)
  for (int64_t i = 0; i < a.n; i++) {
    const bool keep = hash_uniform(a.seed, a.stream, a.offset + uint64_t(i)) >= a.p;
    out[i] = keep ? x[i] * keep_scale : 0.0f;
  }
}

void CpuBackend::dropout_fwd(const DropoutArgs& a) { dropout_apply("dropout_fwd", a); }
void CpuBackend::dropout_bwd(const DropoutArgs& a) { dropout_apply("dropout_bwd", a); }

}  // namespace qlora
