// CPU fused cross-entropy (loss + dlogits) and the PyTorch-exact AdamW step.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_simd.h"
#include "core/error.h"

namespace qlora {

static constexpr int32_t kIgnoreIndex = -100;

void CpuBackend::cross_entropy_fwd_bwd(const CrossEntropyArgs& a) {
  const char* op = "cross_entropy_fwd_bwd";
  cpu::check_dim(op, "n", a.n);
  cpu::check_dim(op, "vocab", a.vocab);
  cpu::check_f32(op, "logits", a.logits, a.n * a.vocab);
  cpu::check_f32(op, "dlogits", a.dlogits, a.n * a.vocab);
  cpu::check_f32(op, "losses", a.losses, a.n);
  cpu::check_ptr(op, "labels", a.labels);
  for (int64_t i = 0; i < a.n; i++) {
    const int32_t y = a.labels[i];
    if (y != kIgnoreIndex && (y < 0 || y >= a.vocab))
      fail(ErrorKind::Data, "cpu op cross_entropy_fwd_bwd, row " + std::to_string(i),
           "label " + std::to_string(y) + " is outside the vocabulary of size " + std::to_string(a.vocab),
           "labels must be token ids or -100 (ignored)");
  }
  const float* logits = a.logits.f32();  // (n,V)
  float* dlogits = a.dlogits.f32();      // (n,V), may be logits itself
  float* losses = a.losses.f32();        // (n)
  const int64_t V = a.vocab;
  if (!(a.softcap >= 0.0f) || !std::isfinite(a.softcap))
    fail(ErrorKind::Internal, "cpu op cross_entropy_fwd_bwd, argument 'softcap'", "must be 0 or positive");
  const float cap = a.softcap;
#pragma omp parallel if (a.n * V > cpu::kParallelMin)
  {
    // The row's tanh(logit / cap) and cap times it (logits may alias dlogits: kept apart).
    std::vector<float> th(cap > 0 ? static_cast<size_t>(V) : 0), capped(th.size());
#pragma omp for schedule(static)
    for (int64_t i = 0; i < a.n; i++) {
      const float* li = logits + i * V;
      float* di = dlogits + i * V;
      const int32_t y = a.labels[i];
      if (y == kIgnoreIndex || V == 0) {
        losses[i] = 0.0f;
        std::fill_n(di, V, 0.0f);
        continue;
      }
      if (cap == 0.0f) {
        losses[i] = cpu::cross_entropy_row(li, di, V, y, a.grad_scale);
        continue;
      }
      // As transformers' Gemma2ForCausalLM: logits / cap, tanh, * cap, in f32.
      for (int64_t j = 0; j < V; j++) {
        th[size_t(j)] = std::tanh(li[j] / cap);
        capped[size_t(j)] = th[size_t(j)] * cap;
      }
      losses[i] = cpu::cross_entropy_row(capped.data(), di, V, y, a.grad_scale);
      for (int64_t j = 0; j < V; j++) di[j] *= 1.0f - th[size_t(j)] * th[size_t(j)];
    }
  }
}

// The Python double a config value was written as: the shortest decimal that rounds to f gives
// back 0.9 (not 0.899999976...) for beta1=0.9f, so step sizes and bias corrections are the
// same doubles torch computes from its Python-float hyperparameters.
static double decimal_value(float f) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  double d = f;
  std::from_chars(buf, r.ptr, d);
  return d;
}

// torch.optim.AdamW, single-tensor (foreach=False) CPU path, in its operation order:
//   p.mul_(1 - lr*wd); m.lerp_(g, 1-b1); v.mul_(b2).addcmul_(g, g, value=1-b2);
//   denom = v.sqrt() / sqrt(1-b2^t) + eps; p.addcdiv_(m, denom, value=-lr/(1-b1^t)).
// Scalars are formed in double like Python, then rounded to f32 as ATen does for f32 tensors.
// ATen's vectorized lerp and addcmul are fused multiply-adds (checked bit-for-bit against
// torch 2.x states in tests/fixtures/backend/hf_ops.json), hence std::fma.
void CpuBackend::adamw(const AdamwArgs& a) {
  const char* op = "adamw";
  cpu::check_dim(op, "n", a.n);
  cpu::check_f32(op, "param", a.param, a.n);
  cpu::check_f32(op, "grad", a.grad, a.n);
  cpu::check_f32(op, "m", a.m, a.n);
  cpu::check_f32(op, "v", a.v, a.n);
  if (a.step < 1)
    fail(ErrorKind::Internal, "cpu op adamw, argument 'step'",
         "step must be >= 1 (bias correction divides by 1-beta^step), got " + std::to_string(a.step));
  const double lr = decimal_value(a.lr), wd = decimal_value(a.weight_decay);
  const double b1 = decimal_value(a.beta1), b2 = decimal_value(a.beta2), eps = decimal_value(a.eps);
  const double step = double(a.step);
  const float decay = float(1.0 - lr * wd);
  const float w1 = float(1.0 - b1);
  const float b2f = float(b2), c2 = float(1.0 - b2);
  const double bc1 = 1.0 - std::pow(b1, step);
  const double bc2 = 1.0 - std::pow(b2, step);
  const float neg_step_size = float(-(lr / bc1));
  const float bc2_sqrt = float(std::pow(bc2, 0.5));
  const float eps_f = float(eps);
  const bool small_w = std::fabs(w1) < 0.5f;  // torch's lerp picks its formula by |weight|

  const cpu::AdamwScalars sc{decay, w1, b2f, c2, neg_step_size, bc2_sqrt, eps_f, small_w};
  float* p = a.param.f32();
  const float* g = a.grad.f32();
  float* m = a.m.f32();
  float* v = a.v.f32();
  constexpr int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (a.n > cpu::kParallelMin)
  for (int64_t i = 0; i < a.n; i += kChunk)
    cpu::adamw_row(p + i, g + i, m + i, v + i, std::min(kChunk, a.n - i), sc);
}

}  // namespace qlora
