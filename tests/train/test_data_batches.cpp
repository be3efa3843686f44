// Micro-batches from examples: padding, packed rows (positions, segments, no cross-document target),
// the epoch-shuffled stream, dataset weights, and packed loss == unpacked loss on the CPU model.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "model_test_util.h"
#include "core/error.h"
#include "text/packing.h"
#include "train/data.h"

namespace qlora {
namespace {

Example doc(std::vector<int32_t> ids, std::vector<int32_t> labels) { return Example{std::move(ids), std::move(labels), {}, {}, {}}; }

TEST(DataBatches, PackedRowRestartsPositionsAndStopsTargetsAtDocumentEnds) {
  Example row;
  row.ids = {5, 6, 7, 8, 9};
  row.labels = {-100, 6, 7, -100, 9};  // docs [5 6 7] and [8 9]
  row.doc_lens = {3, 2};
  Example plain = doc({1, 2, 3}, {1, 2, 3});
  Batch b = pad_batch({&row, &plain}, 0);
  ASSERT_EQ(b.b, 2);
  ASSERT_EQ(b.t, 5);
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{5, 6, 7, 8, 9, 1, 2, 3, 0, 0}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 1, 2, 0, 1}));
  EXPECT_EQ(b.seg, (std::vector<int32_t>{0, 0, 0, 1, 1, 0, 0, 0, 1, 1}));
  // Token 7 ends document 0: its target would be 8 (the next document) and must be -100.
  EXPECT_EQ(b.targets, (std::vector<int32_t>{6, 7, -100, 9, -100, 2, 3, -100, -100, -100}));
  EXPECT_EQ(b.n_trained(), 5);
}

TEST(DataBatches, UnpackedRowsMatchTheHuggingFaceShift) {
  Example a = doc({1, 2, 3, 4}, {-100, -100, 3, 4}), c = doc({7, 8}, {7, 8});
  Batch b = pad_batch({&a, &c}, 99);
  Batch ref = Batch::from_hf(2, 4, {1, 2, 3, 4, 7, 8, 99, 99}, {-100, -100, 3, 4, 7, 8, -100, -100});
  EXPECT_EQ(b.tokens, ref.tokens);
  EXPECT_EQ(b.targets, ref.targets);
  EXPECT_EQ(b.positions, ref.positions);
  EXPECT_TRUE(b.seg.empty());
}

TEST(DataBatches, StreamReshufflesEachEpochAndSeeksExactly) {
  std::vector<Example> ex;
  for (int32_t i = 0; i < 10; i++) ex.push_back(doc({i, i}, {i, i}));
  const ExampleSet set = ExampleSet::of(ex);
  auto epoch_order = [&](DataStream& s) {
    std::vector<int32_t> o;
    for (int k = 0; k < 5; k++) {
      Batch b = s.next();
      o.push_back(b.tokens[0]);
      o.push_back(b.tokens[2]);
    }
    return o;
  };
  DataStream s(&set, 2, 42, 0);
  auto e0 = epoch_order(s), e1 = epoch_order(s);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(std::set<int32_t>(e0.begin(), e0.end()).size(), 10u);
  EXPECT_EQ(std::set<int32_t>(e1.begin(), e1.end()).size(), 10u);
  DataStream again(&set, 2, 42, 0);
  EXPECT_EQ(epoch_order(again), e0);
  DataStream sought(&set, 2, 42, 0);
  sought.seek(1, 0);
  EXPECT_EQ(epoch_order(sought), e1);
  DataStream other(&set, 2, 43, 0);
  EXPECT_NE(epoch_order(other), e0);
}

TEST(DataBatches, WeightsRepeatAndSubsample) {
  std::vector<Example> ex;
  for (int32_t i = 0; i < 10; i++) ex.push_back(doc({i}, {i}));
  EXPECT_EQ(apply_weight(ex, 1.0, 0).size(), 10u);
  auto twice = apply_weight(ex, 2.0, 0);
  ASSERT_EQ(twice.size(), 20u);
  EXPECT_EQ(twice[13].ids[0], 3);
  auto half = apply_weight(ex, 0.5, 9);
  ASSERT_EQ(half.size(), 5u);
  EXPECT_EQ(apply_weight(ex, 0.5, 9)[2].ids, half[2].ids);  // seeded
  std::set<int32_t> distinct;
  for (const auto& e : half) distinct.insert(e.ids[0]);
  EXPECT_EQ(distinct.size(), 5u);
  EXPECT_EQ(apply_weight(ex, 1.3, 1).size(), 13u);
  EXPECT_THROW(apply_weight(ex, 0.0, 1), Error);
}

// The model sees packed documents exactly as it sees them one per row: summed loss and trained
// tokens agree, so the token-weighted loss is the same.
TEST(DataBatches, PackedLossEqualsUnpackedTokenWeightedLoss) {
  using namespace testing_util;
  const int64_t vocab = 96, cap = 24;
  std::mt19937 gen(11);
  std::vector<Example> docs;
  for (int i = 0; i < 9; i++) {
    const int n = 3 + int(gen() % 12);
    Example e;
    for (int j = 0; j < n; j++) {
      e.ids.push_back(int32_t(gen() % vocab));
      e.labels.push_back(j < n / 3 ? -100 : e.ids.back());  // a masked prompt, then the response
    }
    docs.push_back(e);
  }
  PackStats ps;
  std::vector<Example> packed = pack_examples(docs, cap, 3, &ps);
  ASSERT_LT(packed.size(), docs.size());
  ASSERT_GT(ps.efficiency(), 0.5);

  auto total = [&](const std::vector<Batch>& batches, int64_t mb, int64_t t, int64_t* tokens) {
    TestModel m = make_model("llama_gqa", fixture_lora(), mb, t);
    double loss = 0;
    *tokens = 0;
    for (const Batch& b : batches) {
      loss += m.model->forward_loss(b);
      *tokens += b.n_trained();
    }
    return loss;
  };
  int64_t t_sep = 0, t_pk = 0;
  const double l_sep = total(make_batches(docs, 3, 0), 3, cap, &t_sep);
  const double l_pk = total(make_batches(packed, 2, 0), 2, cap, &t_pk);
  EXPECT_EQ(t_sep, t_pk);
  EXPECT_GT(t_sep, 0);
  EXPECT_NEAR(l_pk / double(t_pk), l_sep / double(t_sep), 1e-5 * l_sep / double(t_sep));
  // Without the document boundaries the same rows give a different loss (the check has teeth).
  std::vector<Example> merged = packed;
  for (auto& e : merged) e.doc_lens.clear();
  int64_t t_m = 0;
  const double l_m = total(make_batches(merged, 2, 0), 2, cap, &t_m);
  EXPECT_GT(std::fabs(l_m - l_pk), 1e-3 * std::fabs(l_pk));
}

}  // namespace
}  // namespace qlora
