// gradient_checkpointing: offload on the CUDA backend under the host harness: the same kernels on
// the same data as `full` checkpointing, so the steps are bit-identical; each offloaded layer input
// crosses PCIe once each way per micro-batch (the harness counts cudaMemcpyAsync by direction and
// cudaStreamWaitEvent); the device holds exactly the plan's device bytes and the pinned host memory
// exactly its host bytes. Only a device shows the copies overlapping the layers (bench/device_run.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

constexpr int64_t kLayers = testing_util::kFiveLayers;  // three of the five layer inputs go to the host

std::unique_ptr<DecoderModel> build(Backend& be, const std::string& method, const std::string& precision,
                                  const std::string& ckpt) {
  ModelPlanOptions po;
  po.method = parse_method(method, "method");
  po.base_precision = optional_base_precision(precision, "base_precision");
  po.double_quant = true;
  po.checkpointing = parse_checkpointing(ckpt, "checkpointing");
  return testing_util::five_layer_model(be, po, 0.1);
}

struct Counts {
  long d2h, h2d, waits;
  static Counts now() {
    return {emu::async_copies(cudaMemcpyDeviceToHost), emu::async_copies(cudaMemcpyHostToDevice), emu::stream_waits()};
  }
  Counts operator-(const Counts& o) const { return {d2h - o.d2h, h2d - o.h2d, waits - o.waits}; }
};

// Two AdamW steps of two micro-batches, offload against full on fresh CUDA backends: losses,
// gradient norms, adapter weights and AdamW moments equal bit for bit; offload adds exactly one
// device->host and one host->device copy per offloaded layer input and micro-batch, and the
// stream waits that order them (one for each copy's start, one before its slot is reused or read).
void offload_equals_full(const std::string& method, const std::string& precision) {
  SCOPED_TRACE(method + "/" + (precision.empty() ? "bf16" : precision));
  std::string why;
  auto be_full = make_cuda_backend(&why), be_off = make_cuda_backend(&why);
  ASSERT_TRUE(be_full && be_off) << why;
  auto full = build(*be_full, method, precision, "full");
  auto off = build(*be_off, method, precision, "offload");
  const auto mbs = testing_util::small_micro_batches(full->config().vocab_size);
  OptimHyper h;
  for (int s = 0; s < 2; s++) {
    const Counts c0 = Counts::now();
    const StepResult rf = train_step(*full, mbs, h, 1e-2, s, 5);
    const Counts c1 = Counts::now();
    const StepResult ro = train_step(*off, mbs, h, 1e-2, s, 5);
    const Counts c2 = Counts::now();
    ASSERT_TRUE(std::isfinite(rf.loss)) << "step " << s;
    EXPECT_EQ(ro.loss, rf.loss) << "step " << s;
    EXPECT_EQ(ro.grad_norm, rf.grad_norm) << "step " << s;
    const Counts df = c1 - c0, d_off = c2 - c1;
    const long offloaded = 2 * (kLayers - 2);  // per step: 2 micro-batches x layers 0 .. L-3
    EXPECT_EQ(d_off.d2h - df.d2h, offloaded) << "step " << s;
    EXPECT_EQ(d_off.h2d - df.h2d, offloaded) << "step " << s;
    EXPECT_EQ(d_off.waits - df.waits, 4 * offloaded) << "step " << s;
  }
  auto& pf = full->trainable_params();
  auto& po = off->trainable_params();
  ASSERT_EQ(pf.size(), po.size());
  for (size_t i = 0; i < pf.size(); i++)
    for (auto member : {&TrainParam::w, &TrainParam::m, &TrainParam::v})
      EXPECT_TRUE(testing_util::device_bytes(*full, pf[i].*member) == testing_util::device_bytes(*off, po[i].*member)) << pf[i].name;
  EXPECT_EQ(off->forward_loss(mbs[0]), full->forward_loss(mbs[0]));
}

TEST(CudaEmuOffload, LoraBf16StepsEqualFullCheckpointingBitForBit) { offload_equals_full("lora", ""); }

// With a quantized base the layer-ahead dequantization (side stream) and the offload copies (copy
// stream) run together.
TEST(CudaEmuOffload, QloraNf4StepsEqualFullCheckpointingBitForBit) { offload_equals_full("qlora", "nf4"); }

// The device holds the plan's device total (two slots instead of the layer inputs) and the pinned
// host memory the plan's host total (the offloaded inputs and the backend's upload staging), before
// and after training, with no transient allocation beyond it; all of it goes back with the model.
TEST(CudaEmuOffload, DeviceAndPinnedBytesEqualThePlan) {
  const size_t base = emu::device_bytes_in_use(), pinned_base = emu::pinned_bytes_in_use();
  emu::reset_device_peak();
  std::string why;
  std::unique_ptr<Backend> be = make_cuda_backend(&why);
  ASSERT_TRUE(be) << why;
  auto m = build(*be, "lora", "", "offload");
  const MemoryPlan& plan = m->plan();
  int64_t offloaded = 0;
  for (const auto& b : plan.buffers)
    if (b.host && b.owner == BufferOwner::Arena) offloaded += MemoryPlan::aligned(b.bytes);
  EXPECT_EQ(offloaded, (kLayers - 2) * MemoryPlan::aligned(2 * 12 * m->config().hidden_size * 2));  // bf16 (N,C)
  EXPECT_EQ(m->arena().host_allocated(), offloaded);
  EXPECT_EQ(int64_t(emu::device_bytes_in_use() - base), plan.total_bytes()) << "after building the model";
  OptimHyper h;
  const auto mbs = testing_util::small_micro_batches(m->config().vocab_size);
  for (int s = 0; s < 2; s++) ASSERT_TRUE(std::isfinite(train_step(*m, mbs, h, 1e-2, s, 5).loss));
  be->synchronize();
  EXPECT_EQ(int64_t(emu::device_bytes_in_use() - base), plan.total_bytes()) << "after the steps";
  EXPECT_EQ(int64_t(emu::device_bytes_peak() - base), plan.total_bytes()) << "a transient allocation";
  EXPECT_EQ(int64_t(emu::pinned_bytes_in_use() - pinned_base), plan.host_bytes()) << "pinned host memory";
  m.reset();
  be.reset();
  EXPECT_EQ(emu::device_bytes_in_use(), base) << "device memory left behind";
  EXPECT_EQ(emu::pinned_bytes_in_use(), pinned_base) << "pinned memory left behind";
}

}  // namespace
}  // namespace qlora
