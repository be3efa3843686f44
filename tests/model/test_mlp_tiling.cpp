// Sequence-tiled MLP under checkpointing (mlp_tile): the forward and the backward's recompute run
// the MLP over tiles of rows through one-tile buffers. Tiled training computes what untiled training
// computes, within f32 rounding (the LoRA gradients of the MLP are summed tile by tile), repeats its
// own bits for a fixed tile, keeps LoRA dropout's masks (a tile's mask is its rows of the whole
// one), and the plan lists the MLP buffers one tile long and is what the arena allocates.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/host_memory.h"
#include "model/backend_plan.h"
#include "model/engine_spec.h"
#include "train/engine_config.h"
#include "train/train_config.h"
#include "model_test_util.h"
#include "tasks/bench_run.h"
#include "train/step.h"

namespace qlora {
namespace {

using testing_util::fixtures;
using testing_util::host_copy;

constexpr int64_t kLayers = 3;

std::unique_ptr<DecoderModel> build(Backend& be, const std::string& ckpt, int64_t tile, double dropout) {
  LlamaConfig c = open_model_source(fixtures() + "/models/llama_gqa").config;
  c.n_layer = kLayers;
  ModelPlanOptions po;
  po.micro_batch = 2;
  po.seq_len = 12;
  po.checkpointing = parse_checkpointing(ckpt, "checkpointing");
  po.mlp_tile = tile;
  po.ce_chunk = 8;
  LoraSpec lora = testing_util::fixture_lora();
  lora.dropout = dropout;
  auto m = std::make_unique<DecoderModel>(c, be, po, lora);
  m->load_base(random_tensor_source(7));
  m->init_trainable(1);
  return m;
}

// One forward + backward of two micro-batches (24 tokens each) with tiles of `tile` rows against
// untiled full checkpointing: the loss and every LoRA gradient (before the optimizer) agree to f32
// rounding; then three AdamW steps keep the losses and gradient norms together.
// The fixture model with its trained parity adapter (B != 0, so every LoRA gradient is nonzero).
testing_util::TestModel trained(int64_t tile, double dropout, const std::string& variant = "llama_gqa") {
  ModelPlanOptions po;
  po.micro_batch = 2;
  po.seq_len = 12;
  po.checkpointing = Checkpointing::Full;
  po.mlp_tile = tile;
  po.ce_chunk = 8;
  LoraSpec lora = testing_util::fixture_lora();
  lora.dropout = dropout;
  return testing_util::make_model_on(make_cpu_backend(), variant, po, lora, "parity/" + variant + "_adapter");
}

void expect_tiled_equals_untiled(int64_t tile, double dropout, const std::string& variant = "llama_gqa") {
  testing_util::TestModel a = trained(0, dropout, variant), b = trained(tile, dropout, variant);
  DecoderModel* ref = a.model.get();
  DecoderModel* tiled = b.model.get();
  const auto mbs = testing_util::small_micro_batches(ref->config().vocab_size);
  const StepResult ga = accumulate_grads(*ref, mbs, 0, 5), gb = accumulate_grads(*tiled, mbs, 0, 5);
  ASSERT_TRUE(std::isfinite(ga.loss) && ga.loss > 0);
  EXPECT_LE(std::fabs(gb.loss - ga.loss), 1e-6 * std::fabs(ga.loss));
  const auto& pa = ref->trainable_params();
  const auto& pb = tiled->trainable_params();
  ASSERT_EQ(pa.size(), pb.size());
  double worst = 0;
  for (size_t i = 0; i < pa.size(); i++) {
    const auto x = host_copy(*ref, pa[i].g), y = host_copy(*tiled, pb[i].g);
    ASSERT_EQ(x.size(), y.size());
    double nx = 0, nd = 0;
    for (size_t k = 0; k < x.size(); k++) nx += double(x[k]) * x[k], nd += (double(x[k]) - y[k]) * (double(x[k]) - y[k]);
    ASSERT_GT(nx, 0.0) << pa[i].name << ": a zero gradient proves nothing";
    worst = std::max(worst, std::sqrt(nd / nx));
  }
  EXPECT_LT(worst, 1e-5) << "largest normwise LoRA gradient difference";
  OptimHyper h;
  for (int s = 0; s < 3; s++) {
    const StepResult a = train_step(*ref, mbs, h, 1e-2, s, 5);
    const StepResult b = train_step(*tiled, mbs, h, 1e-2, s, 5);
    EXPECT_LE(std::fabs(b.loss - a.loss), 1e-5 * std::fabs(a.loss)) << "step " << s;
    EXPECT_LE(std::fabs(b.grad_norm - a.grad_norm), 1e-4 * std::fabs(a.grad_norm)) << "step " << s;
  }
  // The eval forward over tiles.
  const double la = ref->forward_loss(mbs[0]), lb = tiled->forward_loss(mbs[0]);
  EXPECT_LE(std::fabs(la - lb), 1e-5 * std::fabs(la));
}

TEST(MlpTiling, TiledTrainingEqualsUntiled) { expect_tiled_equals_untiled(7, 0.0); }  // tiles 7, 7, 7, 3

TEST(MlpTiling, TiledTrainingEqualsUntiledWithDropout) {
  // Without the tile's offset into the dropout mask, each tile would reuse the first rows' mask
  // and the adapters would differ by far more than rounding.
  expect_tiled_equals_untiled(5, 0.1);
}

// Gemma 3: down_proj's output is normed before the residual add, so each tile's backward
// recomputes its down_proj output and that norm (post_feedforward_layernorm).
TEST(MlpTiling, Gemma3SandwichNormsTileToo) { expect_tiled_equals_untiled(7, 0.1, "gemma3"); }
// Phi-3: gate_up_proj's one adapter over the gate and up rows of each tile, its dropout mask shared.
TEST(MlpTiling, Phi3FusedGateUpTiles) { expect_tiled_equals_untiled(7, 0.1, "phi3"); }

TEST(MlpTiling, TiledRunsRepeatTheirBits) {
  auto be1 = make_cpu_backend(), be2 = make_cpu_backend();
  auto a = build(*be1, "full", 8, 0.1), b = build(*be2, "full", 8, 0.1);
  const auto mbs = testing_util::small_micro_batches(a->config().vocab_size);
  OptimHyper h;
  for (int s = 0; s < 2; s++) {
    const StepResult ra = train_step(*a, mbs, h, 1e-2, s, 5), rb = train_step(*b, mbs, h, 1e-2, s, 5);
    EXPECT_EQ(ra.loss, rb.loss);
    EXPECT_EQ(ra.grad_norm, rb.grad_norm);
  }
  for (size_t i = 0; i < a->trainable_params().size(); i++) {
    const auto x = host_copy(*a, a->trainable_params()[i].w), y = host_copy(*b, b->trainable_params()[i].w);
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << a->trainable_params()[i].name;
  }
}

TEST(MlpTiling, OffloadTilesToo) {
  auto be_ref = make_cpu_backend(), be_off = make_cpu_backend();
  auto full = build(*be_ref, "full", 6, 0.0), off = build(*be_off, "offload", 6, 0.0);
  const auto mbs = testing_util::small_micro_batches(full->config().vocab_size);
  OptimHyper h;
  const StepResult a = train_step(*full, mbs, h, 1e-2, 0, 5), b = train_step(*off, mbs, h, 1e-2, 0, 5);
  EXPECT_EQ(a.loss, b.loss);  // offload moves the layer inputs; the tiles are the same computation
  EXPECT_EQ(a.grad_norm, b.grad_norm);
}

TEST(MlpTiling, PlanHoldsOneTileAndIsWhatTheArenaAllocates) {
  auto be = make_cpu_backend();
  auto m = build(*be, "full", 7, 0.1);
  const MemoryPlan& plan = m->plan();
  const int64_t F = m->config().intermediate_size;
  for (const char* name : {"act.cur.gate", "act.cur.up", "act.cur.h", "ws.dgate", "ws.dup"}) {
    const PlannedBuffer* b = plan.find(name);
    ASSERT_TRUE(b) << name;
    EXPECT_EQ(b->shape, (std::vector<int64_t>{7, F})) << name;
  }
  const auto planned = plan.bytes_by_category();
  const auto& alloc = m->arena().allocated();
  for (const auto& [cat, bytes] : planned) EXPECT_EQ(alloc.at(cat), bytes) << mem_category_name(cat);
  // Untiled, the same buffers hold every token; tiles shrink the activations and the workspace.
  auto whole = build(*be, "full", 0, 0.1);
  EXPECT_EQ(whole->plan().find("act.cur.gate")->shape, (std::vector<int64_t>{24, F}));
  EXPECT_LT(plan.total_bytes(), whole->plan().total_bytes());
  // Without checkpointing every layer keeps its MLP activations whole: a tile has no effect.
  auto plain = build(*be, "none", 7, 0.1);
  EXPECT_EQ(plain->plan().find("act.layers.0.gate")->shape, (std::vector<int64_t>{24, F}));
}

TEST(MlpTiling, SpecResolvesAutoTilesAndRefusesTilesWithoutCheckpointing) {
  EngineSpec s;
  s.micro_batch = 1;
  s.seq_len = 65536;
  EXPECT_EQ(resolved_mlp_tile(s), 0);  // no checkpointing: nothing to tile
  s.checkpointing = Checkpointing::Full;
  EXPECT_EQ(resolved_mlp_tile(s), kAutoMlpTileTokens);
  s.seq_len = 4096;
  EXPECT_EQ(resolved_mlp_tile(s), 0);  // fits in one tile
  s.mlp_tile = 1000;
  EXPECT_EQ(resolved_mlp_tile(s), 1000);
  EXPECT_EQ(resolve_engine(s, EngineTarget{}).mlp_tile, 1000);
  s.checkpointing = Checkpointing::None;
  try {
    normalize_engine_spec(s, DType::F32);
    ADD_FAILURE() << "a tile without checkpointing was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--mlp-tile-tokens"), std::string::npos) << e.what();
  }
}

// The auto tile follows the memory the device has: the default while the plan fits, else the
// largest halving that does, the smallest when none does; unknown memory, an explicit tile and a
// mixture of experts (untiled) are left alone.
TEST(MlpTiling, AutoTileIsTheLargestThatFitsTheBudget) {
  const LlamaConfig c = open_model_source(fixtures() + "/models/llama_gqa").config;
  EngineSpec s;
  s.checkpointing = Checkpointing::Full;
  s.seq_len = 32768;
  const ModelPlanOptions o = resolve_engine(s, EngineTarget{});
  ASSERT_EQ(o.mlp_tile, kAutoMlpTileTokens);
  auto total = [&](const ModelPlanOptions& base, int64_t tile) {
    ModelPlanOptions t = base;
    t.mlp_tile = tile;
    MemoryPlan p;
    plan_engine_buffers(p, c, t, DeviceKind::Cpu);
    return p.total_bytes();
  };
  const int64_t t8 = total(o, 8192), t4 = total(o, 4096), t2 = total(o, 2048), t1 = total(o, 1024);
  ASSERT_GT(t8, t4);
  ASSERT_GT(t4, t2);
  ASSERT_GT(t2, t1);
  auto tile = [&](const EngineSpec& spec, const ModelPlanOptions& opts, int64_t budget) {
    return mlp_tile_for_budget(spec, c, opts, DeviceKind::Cpu, budget);
  };
  EXPECT_EQ(tile(s, o, 0), 8192);  // memory unknown: the default
  EXPECT_EQ(tile(s, o, t8), 8192);
  EXPECT_EQ(tile(s, o, t8 - 1), 4096);
  EXPECT_EQ(tile(s, o, t4 - 1), 2048);
  EXPECT_EQ(tile(s, o, t2), 2048);
  EXPECT_EQ(tile(s, o, t1 - 1), kMinAutoMlpTileTokens);  // nothing fits: the smallest, refused later
  // A micro-batch that fits one default tile runs untiled until memory asks for tiles.
  EngineSpec shorter = s;
  shorter.seq_len = 4096;
  const ModelPlanOptions os = resolve_engine(shorter, EngineTarget{});
  ASSERT_EQ(os.mlp_tile, 0);
  EXPECT_EQ(tile(shorter, os, total(os, 0)), 0);
  EXPECT_EQ(tile(shorter, os, total(os, 0) - 1), 2048);  // 8192 and 4096 hold the whole micro-batch
  // An explicit tile is the user's.
  EngineSpec forced = s;
  forced.mlp_tile = 8192;
  EXPECT_EQ(tile(forced, resolve_engine(forced, EngineTarget{}), t1 - 1), 8192);
  // A mixture of experts runs its MLP untiled whatever the length (the model refuses a tile).
  const LlamaConfig moe = open_model_source(fixtures() + "/models/mixtral").config;
  EXPECT_EQ(mlp_tile_for_budget(s, moe, o, DeviceKind::Cpu, 0), 0);
}

// The attention backward's dq on the CUDA backend: accumulated while the plan fits the budget,
// recomputed in its own pass (no f32 accumulator) once it does not, after the MLP tile has shrunk
// as far as it goes; as asked when the spec names it; never changed on the CPU (which has no such
// buffer) or when memory is unknown.
TEST(AttentionDq, RecomputedWhenThePlanDoesNotFitTheBudget) {
  const LlamaConfig c = open_model_source(fixtures() + "/models/llama_gqa").config;
  EngineSpec s;
  s.checkpointing = Checkpointing::Full;
  s.seq_len = 32768;
  const ModelPlanOptions o = resolve_engine(s, EngineTarget{DType::BF16});
  auto total = [&](int64_t tile, AttnDq dq) {
    ModelPlanOptions t = o;
    t.mlp_tile = tile;
    t.attn_dq = dq;
    MemoryPlan p;
    plan_engine_buffers(p, c, t, DeviceKind::Cuda);
    return p.total_bytes();
  };
  const int64_t acc = total(kMinAutoMlpTileTokens, AttnDq::Accumulate), rec = total(kMinAutoMlpTileTokens, AttnDq::Recompute);
  // The accumulator: 32768 tokens x 4 heads x 64 (the kernel's tile width) x 4 bytes.
  EXPECT_EQ(acc - rec, MemoryPlan::aligned(int64_t(32768) * c.n_head * 64 * 4));
  auto fit = [&](const EngineSpec& spec, DeviceKind device, int64_t budget) {
    ModelPlanOptions t = resolve_engine(spec, EngineTarget{DType::BF16});
    fit_to_budget(spec, c, t, device, budget);
    return t;
  };
  EXPECT_EQ(fit(s, DeviceKind::Cuda, 0).attn_dq, AttnDq::Accumulate);  // memory unknown
  EXPECT_EQ(fit(s, DeviceKind::Cuda, total(8192, AttnDq::Accumulate)).attn_dq, AttnDq::Accumulate);
  EXPECT_EQ(fit(s, DeviceKind::Cuda, acc).attn_dq, AttnDq::Accumulate);
  const ModelPlanOptions tight = fit(s, DeviceKind::Cuda, acc - 1);
  EXPECT_EQ(tight.mlp_tile, kMinAutoMlpTileTokens);
  EXPECT_EQ(tight.attn_dq, AttnDq::Recompute);
  EXPECT_EQ(fit(s, DeviceKind::Cuda, rec - 1).attn_dq, AttnDq::Recompute);  // nothing fits: the smaller plan, refused later
  EXPECT_EQ(fit(s, DeviceKind::Cpu, acc - 1).attn_dq, AttnDq::Accumulate);
  EngineSpec forced = s;
  forced.attn_dq = AttnDq::Accumulate;
  EXPECT_EQ(fit(forced, DeviceKind::Cuda, acc - 1).attn_dq, AttnDq::Accumulate);
  forced.attn_dq = AttnDq::Recompute;
  EXPECT_EQ(fit(forced, DeviceKind::Cuda, 0).attn_dq, AttnDq::Recompute);
  // The config key: auto leaves it to the budget; a bad value names the key and the choices.
  auto config = [](const std::string& yaml) { return parse_train_config(yaml, "<string>", {}, nullptr); };
  EXPECT_FALSE(engine_spec(config("attention_dq: auto")).attn_dq.has_value());
  EXPECT_EQ(engine_spec(config("attention_dq: recompute")).attn_dq, AttnDq::Recompute);
  try {
    config("attention_dq: recompte");
    ADD_FAILURE() << "a bad attention_dq was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("attention_dq"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("recompute"), std::string::npos) << e.what();
  }
}

TEST(MlpTiling, ConfigKeyNeedsCheckpointing) {
  TrainConfig c;
  c.mlp_tile_tokens = 512;
  try {
    engine_spec(c);
    ADD_FAILURE() << "mlp_tile_tokens without checkpointing was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_EQ(e.where(), "mlp_tile_tokens");
  }
  c.gradient_checkpointing = Checkpointing::Full;
  EXPECT_EQ(engine_spec(c).mlp_tile, 512);
}

// A plan the machine cannot hold is refused when the model is made, naming both sizes, before the
// arena allocates anything (the CPU backend: the whole plan is host memory).
TEST(HostMemory, APlanLargerThanTheMachineIsRefusedBeforeAllocating) {
  const int64_t avail = available_host_bytes();
  ASSERT_GT(avail, 0) << "/proc/meminfo has MemAvailable";
  LlamaConfig c = open_model_source(fixtures() + "/models/llama_gqa").config;
  ModelPlanOptions po;
  po.micro_batch = 1;
  po.seq_len = 1;
  // Activations grow with the tokens: find a length whose plan is four times what is available.
  while (true) {
    MemoryPlan p;
    plan_model_buffers(p, c, po);
    if (p.total_bytes() > 4 * avail) break;
    po.seq_len *= 2;
  }
  auto be = make_cpu_backend();
  try {
    DecoderModel m(c, *be, po, testing_util::fixture_lora());
    ADD_FAILURE() << "a plan of more than the machine's memory was allocated";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("available (MemAvailable)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qlora
