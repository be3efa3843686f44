// LoRA gradients through the whole model by finite differences, and invariances of the backward:
// checkpointing, CE chunking, packing and dropout must not change what is computed.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "model/peft_io.h"
#include "model_test_util.h"

using namespace qlora;
using namespace qlora::testing_util;

namespace {

Batch random_batch(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(size_t(b * t)), labels(size_t(b * t));
  for (size_t i = 0; i < ids.size(); i++) {
    ids[i] = int32_t(rng.below(uint64_t(vocab)));
    labels[i] = (i % 5 == 2) ? kIgnoreIndex : ids[i];
  }
  return Batch::from_hf(b, t, ids, labels);
}

std::vector<float> host(Backend& be, const Tensor& t) {
  std::vector<float> h(size_t(t.numel()));
  be.copy_to_host(h.data(), t.data, h.size() * 4);
  return h;
}

std::vector<std::vector<float>> grads(TestModel& t) {
  std::vector<std::vector<float>> g;
  for (auto& p : t.model->trainable_params()) g.push_back(host(*t.be, p.g));
  return g;
}

// Gives B non-zero values so every LoRA parameter has a gradient.
void randomize_lora(TestModel& t, uint64_t seed) {
  Rng rng(seed);
  for (auto& p : t.model->trainable_params()) {
    std::vector<float> h(size_t(p.w.numel()));
    for (auto& x : h) x = rng.uniform(-0.2f, 0.2f);
    t.be->copy_to_device(p.w.data, h.data(), h.size() * 4);
  }
}

}  // namespace

TEST(LoraGradients, MatchFiniteDifferences) {
  for (double dropout : {0.0, 0.3}) {
    LoraSpec lora = fixture_lora();
    lora.dropout = dropout;
    TestModel t = make_model("qwen2", lora, 2, 10);
    randomize_lora(t, 7);
    Batch b = random_batch(2, 10, t.model->config().vocab_size, 3);
    const uint64_t seed = 99;
    t.model->zero_grads();
    t.model->forward_backward(b, 1.0f, seed);  // d(summed loss)
    Rng pick(5);
    int checked = 0;
    for (auto& p : t.model->trainable_params()) {
      auto g = host(*t.be, p.g);
      auto w = host(*t.be, p.w);
      for (int k = 0; k < 3; k++) {
        const size_t i = size_t(pick.below(w.size()));
        const float eps = 1e-2f, orig = w[i];
        auto loss_at = [&](float val) {
          w[i] = val;
          t.be->copy_to_device(p.w.data, w.data(), w.size() * 4);
          // grad_scale 0: the same forward (and dropout mask) without touching gradients
          return t.model->forward_backward(b, 0.0f, seed);
        };
        const double fd = (loss_at(orig + eps) - loss_at(orig - eps)) / (2.0 * eps);
        loss_at(orig);
        EXPECT_NEAR(g[i], fd, 2e-2 * std::max(1.0, std::fabs(fd))) << p.name << "[" << i << "] dropout " << dropout;
        checked++;
      }
    }
    EXPECT_EQ(checked, int(t.model->trainable_params().size()) * 3);
  }
}

TEST(LoraGradients, CheckpointingAndChunkingChangeNothing) {
  LoraSpec lora = fixture_lora();
  lora.dropout = 0.1;
  TestModel ref = make_model("llama_gqa", lora, 2, 12, "none", 1024);
  TestModel ck = make_model("llama_gqa", lora, 2, 12, "full", 5);  // 24 tokens in chunks of 5
  randomize_lora(ref, 11);
  randomize_lora(ck, 11);
  Batch b = random_batch(2, 12, ref.model->config().vocab_size, 4);
  ref.model->zero_grads();
  ck.model->zero_grads();
  const double l1 = ref.model->forward_backward(b, 0.05f, 42);
  const double l2 = ck.model->forward_backward(b, 0.05f, 42);
  EXPECT_NEAR(l1, l2, 1e-5 * std::fabs(l1));
  auto g1 = grads(ref), g2 = grads(ck);
  for (size_t i = 0; i < g1.size(); i++) EXPECT_LT(rel_err(g2[i], g1[i]), 1e-5) << ref.model->trainable_params()[i].name;
}

TEST(LoraGradients, PackedDocumentsEqualSeparateRows) {
  // Two documents packed in one row (segment ids, positions restarting) must give the same summed
  // loss and gradients as the same documents in two rows.
  TestModel sep = make_model("llama_gqa", fixture_lora(), 2, 8);
  TestModel pk = make_model("llama_gqa", fixture_lora(), 1, 16);
  randomize_lora(sep, 3);
  randomize_lora(pk, 3);
  Batch rows = random_batch(2, 8, sep.model->config().vocab_size, 9);
  Batch packed;
  packed.b = 1;
  packed.t = 16;
  packed.tokens = rows.tokens;
  packed.targets = rows.targets;  // last target of each document is already -100
  for (int d = 0; d < 2; d++)
    for (int j = 0; j < 8; j++) {
      packed.positions.push_back(j);
      packed.seg.push_back(d);
    }
  sep.model->zero_grads();
  pk.model->zero_grads();
  const double l1 = sep.model->forward_backward(rows, 1.0f, 0);
  const double l2 = pk.model->forward_backward(packed, 1.0f, 0);
  EXPECT_NEAR(l1, l2, 1e-5 * std::fabs(l1));
  auto g1 = grads(sep), g2 = grads(pk);
  for (size_t i = 0; i < g1.size(); i++) EXPECT_LT(rel_err(g2[i], g1[i]), 1e-5);
}

TEST(LoraGradients, AccumulationEqualsTheLargeBatch) {
  TestModel t = make_model("mistral", fixture_lora(), 4, 10);
  randomize_lora(t, 2);
  Batch big = random_batch(4, 10, t.model->config().vocab_size, 8);
  auto half = [&](int h) {
    Batch b;
    b.b = 2;
    b.t = 10;
    b.tokens.assign(big.tokens.begin() + h * 20, big.tokens.begin() + h * 20 + 20);
    b.targets.assign(big.targets.begin() + h * 20, big.targets.begin() + h * 20 + 20);
    b.positions.assign(big.positions.begin() + h * 20, big.positions.begin() + h * 20 + 20);
    return b;
  };
  const float scale = float(1.0 / double(big.n_trained()));
  t.model->zero_grads();
  t.model->forward_backward(big, scale, 0);
  auto g_big = grads(t);
  t.model->zero_grads();
  t.model->forward_backward(half(0), scale, 0);
  t.model->forward_backward(half(1), scale, 0);
  auto g_acc = grads(t);
  for (size_t i = 0; i < g_big.size(); i++) EXPECT_LT(rel_err(g_acc[i], g_big[i]), 1e-5);
}
