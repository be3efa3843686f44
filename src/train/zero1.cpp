// ZeRO-1 over the Comm's block collectives. The flat buffer is laid out rank-major so that each
// rank's shares of all LoRA tensors are one contiguous block: one reduce-scatter and one
// all-gather per step, (N-1)/N x (gradient bytes + weight bytes) through each rank's links.
#include "train/zero1.h"

#include <cmath>

#include "core/error.h"
#include "io/safetensors.h"

namespace qlora {

Slice zero1_share(size_t n, int rank, int world) {
  const size_t per = (n + size_t(world) - 1) / size_t(world);
  Slice s;
  s.begin = std::min(n, size_t(rank) * per);
  s.count = std::min(n, s.begin + per) - s.begin;
  return s;
}

static Tensor view(const Tensor& t, const Slice& s) {
  return Tensor(static_cast<float*>(t.data) + s.begin, DType::F32, {int64_t(s.count)});
}

Zero1Optimizer::Zero1Optimizer(DecoderModel& model, Comm& comm) : model_(model), comm_(comm) {
  const int w = comm_.size();
  block_.assign(size_t(w), 0);
  for (auto& p : model_.trainable_params()) {
    QLORA_ASSERT(p.w.dtype == DType::F32 && p.m.dtype == DType::F32);
    std::vector<Slice> per_rank(static_cast<size_t>(w));
    for (int q = 0; q < w; q++) {
      per_rank[size_t(q)] = zero1_share(size_t(p.w.numel()), q, w);
      block_[size_t(q)] += per_rank[size_t(q)].count;
    }
    QLORA_ASSERT(p.m.numel() >= int64_t(per_rank[size_t(comm_.rank())].count));
    share_.push_back(std::move(per_rank));
  }
  size_t total = 0;
  for (size_t b : block_) total += b;
  flat_.resize(total);
}

void Zero1Optimizer::step(const OptimHyper& h, double lr, int64_t step, double sums[2], StepResult& r, bool* stop_any) {
  Backend& be = model_.backend();
  auto& params = model_.trainable_params();
  const int w = comm_.size(), me = comm_.rank();
  // Pack: block q holds rank q's share of every gradient.
  size_t at = 0;
  for (int q = 0; q < w; q++)
    for (size_t i = 0; i < params.size(); i++) {
      const Slice& s = share_[i][size_t(q)];
      be.copy_to_host(flat_.data() + at, static_cast<float*>(params[i].g.data) + s.begin, s.count * 4);
      at += s.count;
    }
  comm_.reduce_scatter_blocks(flat_.data(), block_);
  size_t mine = 0;
  for (int q = 0; q < me; q++) mine += block_[size_t(q)];
  float* g = flat_.data() + mine;  // my shares, summed over ranks
  double all[3] = {sums[0], sums[1], 0.0};
  for (size_t i = 0; i < block_[size_t(me)]; i++) all[2] += double(g[i]) * double(g[i]);
  comm_.allreduce_sum(all, 3);
  r.loss = all[0];  // the sum of every micro-batch's share
  if (stop_any) *stop_any = all[1] > 0;
  r.grad_norm = std::sqrt(all[2]);
  if (!std::isfinite(r.grad_norm) || !std::isfinite(r.loss)) return;  // every rank sees the same values
  float coef = 1.0f;
  if (h.max_grad_norm > 0) {  // as apply_optimizer: torch's clip_grad_norm_ coefficient, clamped to 1
    const double c = h.max_grad_norm / (r.grad_norm + 1e-6);
    if (c < 1.0) coef = float(c);
  }
  // AdamW over my share of each tensor, then my block of updated weights into flat_.
  size_t off = mine;
  for (size_t i = 0; i < params.size(); i++) {
    TrainParam& p = params[i];
    const Slice& s = share_[i][size_t(me)];
    if (s.count == 0) continue;
    if (coef != 1.0f)
      for (size_t k = 0; k < s.count; k++) flat_[off + k] *= coef;
    be.copy_to_device(static_cast<float*>(p.g.data) + s.begin, flat_.data() + off, s.count * 4);
    be.adamw({.param = view(p.w, s), .grad = view(p.g, s), .m = view(p.m, {0, s.count}), .v = view(p.v, {0, s.count}),
              .n = int64_t(s.count), .lr = float(lr), .beta1 = float(h.beta1), .beta2 = float(h.beta2),
              .eps = float(h.eps), .weight_decay = float(h.weight_decay), .step = step + 1});
    be.copy_to_host(flat_.data() + off, static_cast<float*>(p.w.data) + s.begin, s.count * 4);
    off += s.count;
  }
  comm_.allgather_blocks(flat_.data(), block_);
  at = 0;
  for (int q = 0; q < w; q++)
    for (size_t i = 0; i < params.size(); i++) {
      const Slice& s = share_[i][size_t(q)];
      if (q != me) be.copy_to_device(static_cast<float*>(params[i].w.data) + s.begin, flat_.data() + at, s.count * 4);
      at += s.count;
    }
  be.synchronize();
}

std::vector<std::vector<float>> Zero1Optimizer::gather_moments() {
  Backend& be = model_.backend();
  auto& params = model_.trainable_params();
  const int w = comm_.size(), me = comm_.rank();
  std::vector<std::vector<float>> out;
  for (int which = 0; which < 2; which++) {  // m, then v, each through flat_
    size_t mine = 0;
    for (int q = 0; q < me; q++) mine += block_[size_t(q)];
    size_t off = mine;
    for (size_t i = 0; i < params.size(); i++) {
      const Slice& s = share_[i][size_t(me)];
      be.copy_to_host(flat_.data() + off, (which == 0 ? params[i].m : params[i].v).data, s.count * 4);
      off += s.count;
    }
    comm_.allgather_blocks(flat_.data(), block_);
    std::vector<std::vector<float>> full(params.size());
    for (size_t i = 0; i < params.size(); i++) full[i].assign(size_t(params[i].w.numel()), 0.f);
    size_t at = 0;
    for (int q = 0; q < w; q++)
      for (size_t i = 0; i < params.size(); i++) {
        const Slice& s = share_[i][size_t(q)];
        std::copy(flat_.begin() + long(at), flat_.begin() + long(at + s.count), full[i].begin() + long(s.begin));
        at += s.count;
      }
    if (which == 0) {
      out.resize(2 * params.size());
      for (size_t i = 0; i < params.size(); i++) out[2 * i] = std::move(full[i]);
    } else {
      for (size_t i = 0; i < params.size(); i++) out[2 * i + 1] = std::move(full[i]);
    }
  }
  return out;
}

static std::vector<int64_t> shape_of(const Tensor& t) { return std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim); }

void Zero1Optimizer::load_moments(const std::string& path) {
  SafetensorsArchive ar(path);
  Backend& be = model_.backend();
  auto& params = model_.trainable_params();
  for (size_t i = 0; i < params.size(); i++) {
    TrainParam& p = params[i];
    const Slice& s = share_[i][size_t(comm_.rank())];
    for (int which = 0; which < 2; which++) {
      const std::vector<float> full = ar.read_f32(p.peft_key + (which == 0 ? ".exp_avg" : ".exp_avg_sq"), shape_of(p.w));
      be.copy_to_device((which == 0 ? p.m : p.v).data, full.data() + s.begin, s.count * 4);
    }
  }
}

void write_gathered_optimizer_state(const std::string& path, DecoderModel& model,
                                    const std::vector<std::vector<float>>& moments) {
  SafetensorsWriter w;
  auto& params = model.trainable_params();
  QLORA_ASSERT(moments.size() == 2 * params.size());
  for (size_t i = 0; i < params.size(); i++) {
    w.add_ref(params[i].peft_key + ".exp_avg", DType::F32, shape_of(params[i].w), moments[2 * i].data());
    w.add_ref(params[i].peft_key + ".exp_avg_sq", DType::F32, shape_of(params[i].w), moments[2 * i + 1].data());
  }
  w.write(path);
}

}  // namespace qlora
