// sharding fsdp on the CUDA backend under the host harness, one shard: each layer's blob is
// "gathered" through host memory (the shard copied to the host, the collective, the whole layer
// copied into its fsdp.gather slot on the device, after a synchronize) and dequantized from there,
// so the steps must equal the whole base's bit for bit; the device holds exactly the fsdp plan.
// What a GPU alone can show (the gather's cost, several GPUs) is not tested here.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_emu/emu_runtime.h"
#include "five_layer_model.h"
#include "model/decoder_model.h"
#include "train/step.h"

namespace qlora {
namespace {

std::unique_ptr<DecoderModel> build(Backend& be, const std::string& precision, const std::string& ckpt, int64_t shards) {
  ModelPlanOptions po;
  po.method = parse_method(precision.empty() ? "lora" : "qlora", "method");
  po.base_precision = optional_base_precision(precision, "base_precision");
  po.double_quant = precision == "nf4";
  po.checkpointing = parse_checkpointing(ckpt, "checkpointing");
  po.base_shards = shards;
  return testing_util::five_layer_model(be, po, 0.0);
}

void fsdp_equals_whole(const std::string& precision, const std::string& ckpt) {
  SCOPED_TRACE((precision.empty() ? std::string("bf16") : precision) + " / " + ckpt);
  std::string why;
  auto be_whole = make_cuda_backend(&why), be_fsdp = make_cuda_backend(&why);
  ASSERT_TRUE(be_whole && be_fsdp) << why;
  auto whole = build(*be_whole, precision, ckpt, 0);
  auto fsdp = build(*be_fsdp, precision, ckpt, 1);
  ASSERT_TRUE(fsdp->base_sharded());
  const auto mbs = testing_util::small_micro_batches(whole->config().vocab_size);
  OptimHyper h;
  for (int s = 0; s < 2; s++) {
    const int64_t g0 = fsdp->gathered_base_bytes();
    const StepResult rw = train_step(*whole, mbs, h, 1e-2, s, 5);
    const StepResult rf = train_step(*fsdp, mbs, h, 1e-2, s, 5);
    ASSERT_TRUE(std::isfinite(rw.loss)) << "step " << s;
    EXPECT_EQ(rf.loss, rw.loss) << "step " << s;
    EXPECT_EQ(rf.grad_norm, rw.grad_norm) << "step " << s;
    const int64_t L = whole->config().n_layer;
    const int64_t layers = s == 0 ? (L + (L - 2)) + dequant_layers_per_micro_step(L) : 2 * dequant_layers_per_micro_step(L);
    EXPECT_EQ(fsdp->gathered_base_bytes() - g0, layers * fsdp->base_blob_bytes()) << "step " << s;
  }
  auto& pw = whole->trainable_params();
  auto& pf = fsdp->trainable_params();
  ASSERT_EQ(pw.size(), pf.size());
  for (size_t i = 0; i < pw.size(); i++)
    for (auto member : {&TrainParam::w, &TrainParam::m, &TrainParam::v})
      EXPECT_TRUE(testing_util::device_bytes(*whole, pw[i].*member) == testing_util::device_bytes(*fsdp, pf[i].*member)) << pw[i].name;
  EXPECT_EQ(fsdp->forward_loss(mbs[0]), whole->forward_loss(mbs[0]));
}

TEST(CudaEmuFsdp, QloraNf4OneShardEqualsTheWholeBaseBitForBit) {
  fsdp_equals_whole("nf4", "none");
  fsdp_equals_whole("nf4", "full");
}

TEST(CudaEmuFsdp, LoraBf16OneShardEqualsTheWholeBaseBitForBit) { fsdp_equals_whole("", "full"); }

// The device holds the fsdp plan (the layers' shares and the two gather slots instead of the
// projections) before and after training, with no transient allocation beyond it.
TEST(CudaEmuFsdp, DeviceBytesEqualThePlan) {
  const size_t base = emu::device_bytes_in_use();
  emu::reset_device_peak();
  std::string why;
  std::unique_ptr<Backend> be = make_cuda_backend(&why);
  ASSERT_TRUE(be) << why;
  auto m = build(*be, "nf4", "full", 1);
  const MemoryPlan& plan = m->plan();
  ASSERT_NE(plan.find("fsdp.gather"), nullptr);
  EXPECT_EQ(plan.find("layers.0.q_proj"), nullptr);
  EXPECT_EQ(int64_t(emu::device_bytes_in_use() - base), plan.total_bytes()) << "after building the model";
  OptimHyper h;
  const auto mbs = testing_util::small_micro_batches(m->config().vocab_size);
  for (int s = 0; s < 2; s++) ASSERT_TRUE(std::isfinite(train_step(*m, mbs, h, 1e-2, s, 5).loss));
  be->synchronize();
  EXPECT_EQ(int64_t(emu::device_bytes_peak() - base), plan.total_bytes()) << "a transient allocation";
  m.reset();
  be.reset();
  EXPECT_EQ(emu::device_bytes_in_use(), base) << "device memory left behind";
}

}  // namespace
}  // namespace qlora
