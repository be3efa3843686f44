// The optimizer step shared by the trainer and the parity tests.
#include "train/step.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace qlora {

static uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull);
  x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}

uint64_t micro_batch_seed(uint64_t dropout_seed, int64_t step, int64_t j) {
  return mix(dropout_seed, uint64_t(step) * 1000 + uint64_t(j));
}

double token_mean_share(DecoderModel& model, const Batch& b, int64_t trained_tokens, int64_t micro_batches, uint64_t seed) {
  const float scale = float(1.0 / double(trained_tokens));
  const double aux_weight = 1.0 / double(micro_batches);  // the step's mean of the micro-batches' aux losses
  const double sum = model.forward_backward(b, scale, seed, aux_weight);
  return sum / double(trained_tokens) + model.config().router_aux_loss_coef * aux_weight * model.last_aux_loss();
}

StepResult accumulate_grads(DecoderModel& model, const std::vector<Batch>& mbs, int64_t step, uint64_t dropout_seed,
                            const MicroStepFn& micro) {
  StepResult r;
  for (const auto& b : mbs) {
    r.tokens += b.n();
    r.trained_tokens += b.n_trained();
  }
  if (r.trained_tokens == 0) fail(ErrorKind::Data, "step " + std::to_string(step + 1), "no trained token in the step's micro-batches");
  model.zero_grads();
  double loss = 0;
  for (size_t j = 0; j < mbs.size(); j++) {
    const uint64_t seed = micro_batch_seed(dropout_seed, step, int64_t(j));
    loss += micro ? micro(mbs[j], int64_t(j), seed)
                  : token_mean_share(model, mbs[j], r.trained_tokens, int64_t(mbs.size()), seed);
  }
  r.loss = loss;
  return r;
}

void apply_optimizer(DecoderModel& model, const OptimHyper& h, double lr, int64_t step, StepResult& r) {
  Backend& be = model.backend();
  double sq = 0;
  SumsqArgs norm{{}, &sq};
  for (auto& p : model.trainable_params()) norm.xs.push_back(p.g);
  be.sumsq(norm);  // one reduction over every gradient
  r.grad_norm = std::sqrt(sq);
  if (!std::isfinite(r.grad_norm) || !std::isfinite(r.loss)) return;
  if (h.max_grad_norm > 0) {  // torch.nn.utils.clip_grad_norm_: coef = max/(norm+1e-6), clamped to 1
    const double coef = h.max_grad_norm / (r.grad_norm + 1e-6);
    if (coef < 1.0)
      for (auto& p : model.trainable_params()) be.scale({.x = p.g, .n = p.g.numel(), .s = float(coef)});
  }
  for (auto& p : model.trainable_params())
    be.adamw({.param = p.w, .grad = p.g, .m = p.m, .v = p.v, .n = p.w.numel(), .lr = float(lr), .beta1 = float(h.beta1),
              .beta2 = float(h.beta2), .eps = float(h.eps), .weight_decay = p.decay ? float(h.weight_decay) : 0.0f, .step = step + 1});
  be.synchronize();
}

StepResult train_step(DecoderModel& model, const std::vector<Batch>& mbs, const OptimHyper& h, double lr, int64_t step,
                      uint64_t dropout_seed, const MicroStepFn& micro) {
  StepResult r = accumulate_grads(model, mbs, step, dropout_seed, micro);
  apply_optimizer(model, h, lr, step, r);
  return r;
}

std::string first_non_finite(DecoderModel& model, double loss) {
  if (!std::isfinite(loss)) return "the loss";
  Backend& be = model.backend();
  for (auto& p : model.trainable_params()) {
    double sq = 0;
    be.sumsq({.xs = {p.g}, .out = &sq});
    if (!std::isfinite(sq)) {
      // A finite sum of squares can still overflow to inf; look at the elements to be sure.
      std::vector<float> g(size_t(p.g.numel()));
      if (p.g.dtype == DType::F32) {
        be.copy_to_host(g.data(), p.g.data, g.size() * 4);
        for (float v : g)
          if (!std::isfinite(v)) return "the gradient of " + p.name;
      } else {
        return "the gradient of " + p.name;
      }
    }
  }
  return "";
}

bool optimizer_state_finite(DecoderModel& model) {
  Backend& be = model.backend();
  SumsqArgs all{{}, nullptr};
  for (auto& p : model.trainable_params()) {
    all.xs.push_back(p.w);
    all.xs.push_back(p.m);
    all.xs.push_back(p.v);
  }
  double sq = 0;
  all.out = &sq;
  be.sumsq(all);
  if (std::isfinite(sq)) return true;
  for (auto& p : model.trainable_params())
    for (const Tensor* t : {&p.w, &p.m, &p.v}) {
      std::vector<float> h(size_t(t->numel()));
      be.copy_to_host(h.data(), t->data, h.size() * 4);
      for (float v : h)
        if (!std::isfinite(v)) return false;
    }
  return true;  // finite elements whose squares overflowed
}

}  // namespace qlora
