// QLoRA in the engine: the frozen base stored quantized in the arena and dequantized per use.
// References: transformers + bitsandbytes 4-bit on CPU (tools/make_qlora_fixtures.py), and for the
// formats bitsandbytes lacks, the same engine fed the dequantized weights as plain floats.
#include <gtest/gtest.h>

#include "forwarding_backend.h"
#include "model/peft_io.h"
#include "model/quant_bytes.h"
#include "model_test_util.h"
#include "plan/gpu_catalog.h"
#include "plan/planner.h"
#include "train/step.h"

using namespace qlora;
using namespace qlora::testing_util;

namespace {

// bitsandbytes dequantizes to exactly the f32 weights the engine does, so only the summation order
// of the f32 matmuls differs (logits are O(1), |logit| <= ~4).
constexpr double kBnbTol = 1e-5;
constexpr double kGradTol = 2e-5;  // rel_err, as the fp32 parity tests (2.3e-6 seen)

struct QModel {
  std::unique_ptr<Backend> be;
  ModelSource src;
  std::unique_ptr<DecoderModel> model;
};

ModelPlanOptions qopts(const std::string& precision, bool dq, int64_t blocksize, const std::string& ckpt = "none") {
  ModelPlanOptions po;
  po.method = Method::Qlora;
  po.base_precision = optional_base_precision(precision, "base_precision");
  po.double_quant = dq;
  po.quant_blocksize = blocksize;
  po.micro_batch = 2;
  po.seq_len = 12;
  po.checkpointing = parse_checkpointing(ckpt, "checkpointing");
  return po;
}

QModel make_qmodel(const std::string& dir, ModelPlanOptions po, bool adopt = false) {
  QModel t;
  t.be = make_cpu_backend();
  t.src = open_model_source(dir);
  if (adopt) adopt_stored_quantization(po, t.src.tensors);
  t.model = std::make_unique<DecoderModel>(t.src.config, *t.be, po, fixture_lora());
  t.model->load_base(t.src.tensors);
  t.model->init_trainable(1);
  return t;
}

// `base` with every projection replaced by dequantize(quantize(w)): what a float model must load
// to compute exactly what the quantized engine computes.
TensorSource dequantized_source(const TensorSource& base, QuantParams p) {
  TensorSource s = base;
  s.read_f32 = [base, p](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    base.read_f32(n, shape, dst);
    if (shape.size() != 2 || n.find("_proj.weight") == std::string::npos) return;
    QuantizedTensor q = quantize_ref(dst, shape[0], shape[1], p);
    dequantize_ref(q, dst);
  };
  return s;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); i++) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

struct Fixture {
  SafetensorsArchive fx{fixtures() + "/qlora/llama_gqa_nf4.safetensors"};
  Batch batch = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
};

std::vector<float> grad_of(DecoderModel& m, TrainParam& p) {
  std::vector<float> g(size_t(p.g.numel()));
  m.backend().copy_to_host(g.data(), p.g.data, g.size() * 4);
  return g;
}

}  // namespace

TEST(QloraParity, Nf4DoubleQuantLogitsMatchTransformersBitsandbytes) {
  Fixture f;
  QModel t = make_qmodel(fixtures() + "/models/llama_gqa", qopts("nf4", true, 64));
  ASSERT_TRUE(t.model->quantized_base());
  auto logits = t.model->logits(f.batch);
  const auto ref = floats(f.fx, "logits");
  EXPECT_LT(max_abs_diff(logits, ref), kBnbTol);
  const double loss = t.model->forward_loss(f.batch) / double(f.batch.n_trained());
  EXPECT_NEAR(loss, floats(f.fx, "loss")[0], kBnbTol);
  // The check can fail: 4-bit weights move the logits far beyond the tolerance.
  SafetensorsArchive fp32(fixtures() + "/parity/llama_gqa.safetensors");
  EXPECT_GT(max_abs_diff(floats(fp32, "logits"), ref), 1000 * kBnbTol);
}

TEST(QloraParity, Fp4LogitsMatchTransformersBitsandbytes) {
  Fixture f;
  QModel t = make_qmodel(fixtures() + "/models/llama_gqa", qopts("fp4", false, 64));
  const auto ref = floats(f.fx, "fp4_logits");
  EXPECT_LT(max_abs_diff(t.model->logits(f.batch), ref), kBnbTol);
  EXPECT_GT(max_abs_diff(floats(f.fx, "logits"), ref), 1000 * kBnbTol) << "fp4 and nf4 should differ";
}

// LoRA on top of the 4-bit base: logits, loss and every LoRA gradient equal PEFT's on bitsandbytes.
TEST(QloraParity, LoraOnNf4BaseMatchesPeftLogitsLossAndGradients) {
  Fixture f;
  QModel t = make_qmodel(fixtures() + "/models/llama_gqa", qopts("nf4", true, 64));
  load_peft_adapter(fixtures() + "/parity/llama_gqa_adapter", *t.model);
  EXPECT_LT(max_abs_diff(t.model->logits(f.batch), floats(f.fx, "lora_logits")), kBnbTol);
  t.model->zero_grads();
  const double n = double(f.batch.n_trained());
  const double loss = t.model->forward_backward(f.batch, float(1.0 / n), 0) / n;
  EXPECT_NEAR(loss, floats(f.fx, "lora_loss")[0], kBnbTol);
  int checked = 0;
  for (auto& p : t.model->trainable_params()) {
    const auto ref = floats(f.fx, "grad." + p.peft_key);
    EXPECT_LT(rel_err(grad_of(*t.model, p), ref), kGradTol) << p.peft_key;
    checked++;
  }
  EXPECT_EQ(checked, 28);
}

// The checkpoint transformers saved (save_pretrained of the 4-bit model) is copied into the arena
// as stored: the same bytes the engine's own quantization produces, hence the same logits.
TEST(QloraCheckpoint, TransformersSavedNf4CheckpointLoadsAsStored) {
  Fixture f;
  QModel pre = make_qmodel(fixtures() + "/qlora/llama_gqa_bnb_nf4", qopts("", true, 64), /*adopt=*/true);
  ASSERT_TRUE(pre.model->quantized_base());
  EXPECT_EQ(pre.model->base_quant().format, QuantFormat::NF4);
  EXPECT_TRUE(pre.model->base_quant().double_quant);
  EXPECT_EQ(pre.model->base_quant().blocksize, 64);
  QModel own = make_qmodel(fixtures() + "/models/llama_gqa", qopts("nf4", true, 64));
  for (int64_t l = 0; l < 2; l++)
    for (const auto& proj : all_linear_targets()) {
      const QuantizedTensor a = pre.model->base_quantized(l, proj), b = own.model->base_quantized(l, proj);
      EXPECT_EQ(a.data, b.data) << l << proj;
      EXPECT_EQ(a.absmax_q, b.absmax_q) << l << proj;
      EXPECT_EQ(a.nested_absmax, b.nested_absmax) << l << proj;
      EXPECT_EQ(a.nested_code, b.nested_code) << l << proj;
      EXPECT_EQ(a.offset, b.offset) << l << proj;
    }
  const auto logits = pre.model->logits(f.batch);
  EXPECT_EQ(logits, own.model->logits(f.batch));
  EXPECT_LT(max_abs_diff(logits, floats(f.fx, "logits")), kBnbTol);
}

// A multimodal Gemma 3 as the Hub's "-bnb-4bit" checkpoints ship it (Gemma3ForConditionalGeneration
// saved 4-bit by transformers + bitsandbytes, its SigLIP tower quantized too; tools/
// make_qlora_fixtures.py --multimodal): the language model's projections load as stored from under
// language_model., the tower is skipped, and the text-only logits equal transformers +
// bitsandbytes' on the same checkpoint; loaded into a float base (dequantized on load) too.
TEST(QloraCheckpoint, MultimodalGemma3Bnb4bitCheckpointLoadsItsLanguageModel) {
  SafetensorsArchive fx(fixtures() + "/qlora/gemma3_mm_nf4.safetensors");
  const auto ids = ints(fx, "input_ids");
  const Batch batch = Batch::from_hf(2, 12, ids, ids);
  const auto ref = floats(fx, "logits");
  const std::string dir = fixtures() + "/qlora/gemma3_mm_bnb_nf4";
  QModel q = make_qmodel(dir, qopts("", true, 64), /*adopt=*/true);
  EXPECT_EQ(q.src.config.multimodal, "gemma3");
  ASSERT_TRUE(q.model->quantized_base());
  EXPECT_EQ(q.model->base_quant().format, QuantFormat::NF4);
  EXPECT_TRUE(q.model->base_quant().double_quant);
  EXPECT_LT(max_abs_diff(q.model->logits(batch), ref), kBnbTol);
  ModelPlanOptions po = qopts("fp32", false, 64);
  po.method = Method::Lora;
  QModel f = make_qmodel(dir, po);
  EXPECT_FALSE(f.model->quantized_base());
  EXPECT_LT(max_abs_diff(f.model->logits(batch), ref), kBnbTol);
  // The check can fail: the float multimodal model's logits are far from the 4-bit ones.
  SafetensorsArchive fp32(fixtures() + "/parity/gemma3_mm.safetensors");
  EXPECT_GT(max_abs_diff(floats(fp32, "logits"), ref), 1000 * kBnbTol);
}

// The same checkpoint also loads into a float base (dequantized on load): same numbers.
TEST(QloraCheckpoint, PreQuantizedCheckpointLoadsIntoAFloatBase) {
  Fixture f;
  ModelPlanOptions po = qopts("fp32", false, 64);
  po.method = Method::Lora;
  QModel t = make_qmodel(fixtures() + "/qlora/llama_gqa_bnb_nf4", po);
  EXPECT_FALSE(t.model->quantized_base());
  EXPECT_LT(max_abs_diff(t.model->logits(f.batch), floats(f.fx, "logits")), kBnbTol);
}

// Every format: the quantized engine computes exactly what a float engine computes on the
// dequantized weights, forward and backward, with and without recomputation (checkpointing).
TEST(QloraEngine, EveryFormatEqualsAFloatModelOfItsDequantizedWeights) {
  Fixture f;
  const std::string dir = fixtures() + "/models/llama_gqa";
  SafetensorsArchive fp32(fixtures() + "/parity/llama_gqa.safetensors");
  struct Case { std::string precision; bool dq; int64_t bs; std::string ckpt; };
  for (const Case& c : {Case{"nf4", true, 128, "none"}, Case{"fp4", false, 32, "full"}, Case{"nvfp4", false, 64, "none"},
                        Case{"mxfp4", true, 64, "full"}, Case{"fp8", true, 64, "none"}}) {
    SCOPED_TRACE(c.precision);
    QModel q = make_qmodel(dir, qopts(c.precision, c.dq, c.bs, c.ckpt));
    const QuantParams p = base_quant_params(parse_base_precision(c.precision, "precision"), c.bs, c.dq);
    QModel ref;
    ref.be = make_cpu_backend();
    ref.src = open_model_source(dir);
    ModelPlanOptions po = qopts("fp32", false, 64, c.ckpt);
    po.method = Method::Lora;
    ref.model = std::make_unique<DecoderModel>(ref.src.config, *ref.be, po, fixture_lora());
    ref.model->load_base(dequantized_source(ref.src.tensors, p));
    for (QModel* m : {&q, &ref}) load_peft_adapter(fixtures() + "/parity/llama_gqa_adapter", *m->model);

    const auto lq = q.model->logits(f.batch), lr = ref.model->logits(f.batch);
    EXPECT_EQ(lq, lr);
    EXPECT_GT(max_abs_diff(lq, floats(fp32, "lora_logits")), 1e-4) << "quantization should change the logits";
    q.model->zero_grads();
    ref.model->zero_grads();
    const double s = 1.0 / double(f.batch.n_trained());
    EXPECT_EQ(q.model->forward_backward(f.batch, float(s), 7), ref.model->forward_backward(f.batch, float(s), 7));
    for (size_t i = 0; i < q.model->trainable_params().size(); i++) {
      auto& a = q.model->trainable_params()[i];
      auto& b = ref.model->trainable_params()[i];
      EXPECT_EQ(grad_of(*q.model, a), grad_of(*ref.model, b)) << a.peft_key;
    }
  }
}

// QLoRA trains: AdamW steps on the NF4 base lower the loss of the batch they see.
TEST(QloraEngine, TrainingStepsOnNf4BaseLowerTheLoss) {
  Fixture f;
  QModel t = make_qmodel(fixtures() + "/models/llama_gqa", qopts("nf4", true, 64));
  load_peft_adapter(fixtures() + "/parity/llama_gqa_adapter", *t.model);
  OptimHyper h;
  double first = 0, last = 0;
  for (int s = 0; s < 6; s++) {
    StepResult r = train_step(*t.model, {f.batch}, h, 5e-3, s, 0);
    ASSERT_TRUE(std::isfinite(r.loss));
    (s == 0 ? first : last) = r.loss;
  }
  EXPECT_LT(last, first - 0.05);
}

// The memory plan holds each projection's exact quantized bytes, counted here by hand from the
// bitsandbytes layout: n/2 packed bytes, a u8 absmax per 64-block, an f32 nested absmax per 256
// blocks, the f32 offset and the 256-entry f32 nested code.
TEST(QloraEngine, PlanHoldsTheQuantizedBytesOfEveryProjection) {
  QModel t = make_qmodel(fixtures() + "/models/llama_gqa", qopts("nf4", true, 64));
  const LlamaConfig& c = t.model->config();
  int checked = 0;
  for (int64_t l = 0; l < c.n_layer; l++)
    for (const auto& proj : all_linear_targets()) {
      const auto [out, in] = projection_shape(c, proj);
      const int64_t n = out * in, nb = (n + 63) / 64;
      const PlannedBuffer* b = t.model->plan().find("layers." + std::to_string(l) + "." + proj);
      ASSERT_NE(b, nullptr);
      EXPECT_EQ(b->dtype, DType::U8);
      EXPECT_EQ(b->bytes, n / 2 + nb + (nb + 255) / 256 * 4 + 4 + 256 * 4) << proj;
      checked++;
    }
  EXPECT_EQ(checked, 14);
  const PlannedBuffer* ws = t.model->plan().find("ws.dequant");
  ASSERT_NE(ws, nullptr);
  int64_t layer = 0;  // two slots of one layer's seven projections, in the compute dtype
  for (const auto& proj : all_linear_targets()) layer += projection_shape(c, proj).first * projection_shape(c, proj).second;
  EXPECT_EQ(ws->shape, (std::vector<int64_t>{2, layer}));
  EXPECT_EQ(t.model->plan().find("embed_tokens")->dtype, DType::F32);
  EXPECT_EQ(t.model->plan().find("lm_head")->dtype, DType::F32);
}

// Loading streams: one read per tensor (each projection is read, quantized and dropped on its own),
// never a read larger than the largest single tensor.
TEST(QloraEngine, LoadReadsOneTensorAtATime) {
  auto be = make_cpu_backend();
  ModelSource src = open_model_source(fixtures() + "/models/llama_gqa");
  std::vector<std::pair<std::string, int64_t>> reads;
  TensorSource spy = src.tensors;
  spy.read_f32 = [&](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    int64_t e = 1;
    for (int64_t s : shape) e *= s;
    reads.emplace_back(n, e);
    src.tensors.read_f32(n, shape, dst);
  };
  DecoderModel m(src.config, *be, qopts("nf4", true, 64), fixture_lora());
  m.load_base(spy);
  EXPECT_EQ(reads.size(), size_t(2 + 2 * 9 + 1));  // embed, lm_head, per layer 2 norms + 7 projections, norm
  for (const auto& [n, e] : reads) EXPECT_LE(e, 160 * 64) << n;  // never more than the largest tensor
}

namespace {

// The CPU backend under another device's name: the engine then stages quantized bytes through host
// copies (copy_to_device / copy_to_host) as it must for a GPU, instead of reading them in place.
class RemoteCpu : public ForwardingCpu {
 public:
  std::string name() const override { return "remote-cpu"; }
  DeviceKind device() const override { return DeviceKind::Cuda; }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    uploads++;
    cpu_->copy_to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    downloads++;
    cpu_->copy_to_host(dst, src, bytes);
  }
  int64_t uploads = 0, downloads = 0;
};

}  // namespace

TEST(QloraEngine, DeviceBackendPathGivesTheSameNumbers) {
  Fixture f;
  QModel cpu = make_qmodel(fixtures() + "/models/llama_gqa", qopts("nf4", true, 64));
  RemoteCpu be;
  ModelSource src = open_model_source(fixtures() + "/models/llama_gqa");
  DecoderModel m(src.config, be, qopts("nf4", true, 64), fixture_lora());
  m.load_base(src.tensors);
  m.init_trainable(1);
  const int64_t downloads_before = be.downloads;
  EXPECT_EQ(m.logits(f.batch), cpu.model->logits(f.batch));
  // Dequantization is the backend's op: the packed bytes stay on the device (the logits come back).
  EXPECT_LT(be.downloads - downloads_before, 14) << "projection bytes should not travel to the host";
  for (const auto& proj : all_linear_targets())
    EXPECT_EQ(m.base_quantized(1, proj).data, cpu.model->base_quantized(1, proj).data) << proj;
}

// The planner's dequant traffic is what the engine does. ws.dequant holds two layers and the next
// layer is prepared ahead, so after a first step each micro-step dequantizes
// dequant_layers_per_micro_step(L) layers, with or without checkpointing (a recompute shares its
// layer's dequantization with the gradients); qlora plan's "base weight dequant/cast" line is that
// many layers' stored bytes read plus their bf16 GEMM operand written, per micro-step.
TEST(QloraEngine, DequantTrafficIsWhatThePlannerCounts) {
  SafetensorsArchive fx(fixtures() + "/qlora/llama_gqa_nf4.safetensors");
  const Batch batch = Batch::from_hf(2, 12, ints(fx, "input_ids"), ints(fx, "labels"));
  // The two-layer fixture stretched to 6 layers (layer l reads the fixture's layer l % 2), so the
  // steady state has layers to dequantize.
  QModel t0 = make_qmodel(fixtures() + "/models/llama_gqa", qopts("nf4", true, 64));
  LlamaConfig deep = t0.src.config;
  deep.n_layer = 6;
  TensorSource deep_src = t0.src.tensors;
  auto fold = [](std::string n) {
    const std::string pre = "model.layers.";
    if (n.rfind(pre, 0) == 0) {
      const size_t dot = n.find('.', pre.size());
      n = pre + std::to_string(std::stoi(n.substr(pre.size(), dot - pre.size())) % 2) + n.substr(dot);
    }
    return n;
  };
  const TensorSource base = t0.src.tensors;
  deep_src.has = [base, fold](const std::string& n) { return base.has(fold(n)); };
  deep_src.read_f32 = [base, fold](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    base.read_f32(fold(n), shape, dst);
  };
  for (const char* ckpt : {"none", "full"}) {
    SCOPED_TRACE(ckpt);
    QModel t;
    t.model = std::make_unique<DecoderModel>(deep, *t0.be, qopts("nf4", true, 64, ckpt), fixture_lora());
    t.model->load_base(deep_src);
    t.model->init_trainable(1);
    const int64_t L = t.model->config().n_layer;
    accumulate_grads(*t.model, {batch}, 0, 0);
    EXPECT_EQ(t.model->dequantized_layers(), L + (L - 2)) << "first step: every layer, then all but the last two";
    const int64_t before = t.model->dequantized_layers();
    accumulate_grads(*t.model, {batch, batch}, 1, 0);  // two micro-steps
    EXPECT_EQ(t.model->dequantized_layers() - before, 2 * dequant_layers_per_micro_step(L));

    PlanRequest req;
    req.model = t.model->config();
    req.gpu = resolve_gpu("h100-sxm");
    req.method = Method::Qlora;
    req.base_precision = BasePrecision::Nf4;
    req.double_quant = true;
    req.quant_blocksize = 64;
    req.micro_batch = 2;
    req.seq_len = 12;
    req.grad_accum = 2;
    req.checkpointing = parse_checkpointing(ckpt, "checkpointing");
    const PlanResult plan = make_plan(req);
    double planned = -1;
    for (const auto& [what, bytes] : plan.speed.memory_bytes)
      if (what == "base weight dequant/cast") planned = bytes;
    double layer_bytes = 0;  // layer 0's stored projections plus their bf16 copies
    for (const auto& proj : all_linear_targets()) {
      const auto [out, in] = projection_shape(t.model->config(), proj);
      layer_bytes += double(t.model->plan().find("layers.0." + proj)->bytes) + 2.0 * double(out * in);
    }
    EXPECT_DOUBLE_EQ(planned, layer_bytes * double(t.model->dequantized_layers() - before));
  }
}
