// The numeric guards' diagnosis: which tensor went non-finite, and whether the state that a
// checkpoint would hold is finite.
#include <gtest/gtest.h>

#include <limits>

#include "model_test_util.h"
#include "train/step.h"

using namespace qlora;
using namespace qlora::testing_util;

namespace {

TEST(NumericGuards, FirstNonFiniteNamesTheLossThenTheFirstBadGradient) {
  TestModel t = make_model("llama_gqa", fixture_lora(), 2, 12);
  SafetensorsArchive fx(fixtures() + "/parity/llama_gqa.safetensors");
  const Batch b = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
  t.model->zero_grads();
  const double loss = t.model->forward_backward(b, 1.0f / float(b.n_trained()), 0);
  ASSERT_TRUE(std::isfinite(loss));
  EXPECT_EQ(first_non_finite(*t.model, loss), "");
  EXPECT_EQ(first_non_finite(*t.model, std::numeric_limits<double>::quiet_NaN()), "the loss");

  // Poison one element of the 6th and the 3rd gradient: the 3rd is named (parameter order).
  auto& params = t.model->trainable_params();
  ASSERT_GT(params.size(), 6u);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  t.be->copy_to_device(static_cast<float*>(params[5].g.data) + 1, &inf, 4);
  EXPECT_EQ(first_non_finite(*t.model, loss), "the gradient of " + params[5].name);
  t.be->copy_to_device(static_cast<float*>(params[2].g.data) + 3, &nan, 4);
  EXPECT_EQ(first_non_finite(*t.model, loss), "the gradient of " + params[2].name);
}

TEST(NumericGuards, OptimizerStateFiniteSeesAnyBadWeightOrMoment) {
  TestModel t = make_model("llama_gqa", fixture_lora(), 1, 8);
  EXPECT_TRUE(optimizer_state_finite(*t.model));
  auto& p = t.model->trainable_params()[4];
  const float nan = std::numeric_limits<float>::quiet_NaN();
  t.be->copy_to_device(static_cast<float*>(p.v.data) + 2, &nan, 4);
  EXPECT_FALSE(optimizer_state_finite(*t.model));
  const float zero = 0.0f;
  t.be->copy_to_device(static_cast<float*>(p.v.data) + 2, &zero, 4);
  EXPECT_TRUE(optimizer_state_finite(*t.model));
  // Finite but huge: the sum of squares overflows, the state is still finite.
  const float big = 3e38f;
  t.be->copy_to_device(static_cast<float*>(p.w.data), &big, 4);
  t.be->copy_to_device(static_cast<float*>(p.w.data) + 1, &big, 4);
  EXPECT_TRUE(optimizer_state_finite(*t.model));
}

}  // namespace
