// The planner prices the base GEMMs the engine runs (model/gemm_dtype.h): FP4 GEMMs on an NVFP4 or
// MXFP4 base plan the GEMM scales beside each projection and the activation quantizer's scratch,
// run the forward and recompute at the FP4 rate and the backward at bf16 on dequantized layers;
// what the engine refuses (no such tensor cores, another base) the planner refuses too.
#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "model/gemm_dtype.h"
#include "model/model_plan.h"
#include "plan/model_presets.h"
#include "plan/planner.h"
#include "quant/fp4_gemm.h"

using namespace qlora;

namespace {

PlanRequest request(const std::string& model, const std::string& gpu, const std::string& base) {
  PlanRequest r;
  r.model = preset_config(model);
  r.model_label = model;
  r.gpu = resolve_gpu(gpu);
  r.method = Method::Qlora;
  r.base_precision = optional_base_precision(base, "base_precision");
  r.checkpointing = Checkpointing::Full;
  return r;
}

double bytes_of(const SpeedEstimate& s, const std::string& what) {
  for (const auto& [k, v] : s.memory_bytes)
    if (k == what) return v;
  return -1;
}

std::string config_error(const PlanRequest& r) {
  try {
    make_plan(r);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

}  // namespace

TEST(GemmDtypePlan, Fp4OnB200PlansTheEngineBuffersAndRows) {
  for (const char* base : {"nvfp4", "mxfp4"}) {
    SCOPED_TRACE(base);
    PlanRequest r = request("llama3-8b", "b200", base);
    const PlanResult bf = make_plan(r);
    r.gemm_dtype = GemmDtype::Fp4;
    const PlanResult f4 = make_plan(r);
    const LlamaConfig& c = f4.req.model;
    const auto [out, in] = projection_shape(c, "down_proj");
    const PlannedBuffer* sf = f4.plan.find("layers.0.down_proj.gemm_scales");
    ASSERT_NE(sf, nullptr);
    EXPECT_EQ(sf->bytes, fp4_gemm_scales_bytes(out, in));
    EXPECT_EQ(sf->category, MemCategory::Weights);
    EXPECT_NE(f4.plan.find("cuda.fp4_act"), nullptr);
    EXPECT_EQ(bf.plan.find("layers.0.down_proj.gemm_scales"), nullptr);
    // The GEMM scales (1/16 byte per weight, tiles padded) on top of the bf16 plan's weights.
    EXPECT_GT(f4.categories.at(MemCategory::Weights), bf.categories.at(MemCategory::Weights));
    EXPECT_LT(f4.categories.at(MemCategory::Weights), bf.categories.at(MemCategory::Weights) * 1.15);
    // Forward + recompute at the FP4 rate: less GEMM time; only the backward dequantizes (L layers).
    EXPECT_LT(f4.speed.t_gemm, bf.speed.t_gemm);
    EXPECT_LT(bytes_of(f4.speed, "base weight dequant/cast"), bytes_of(bf.speed, "base weight dequant/cast"));
    EXPECT_GT(bytes_of(f4.speed, "activation quantization (fp4 GEMMs)"), 0.0);
    EXPECT_EQ(bytes_of(bf.speed, "activation quantization (fp4 GEMMs)"), -1.0);
    EXPECT_EQ(dequant_layers_per_micro_step(c.n_layer, GemmDtype::Fp4), c.n_layer);
  }
}

TEST(GemmDtypePlan, RefusesWhatTheEngineRefuses) {
  PlanRequest r = request("llama3-8b", "h100", "nvfp4");
  r.gemm_dtype = GemmDtype::Fp4;
  EXPECT_NE(config_error(r).find("no fp4 tensor cores"), std::string::npos);
  r.gpu = resolve_gpu("rtx5090");  // FP4 tensor cores, but compute capability 12.0: no cuBLASLt NVFP4 GEMM here
  EXPECT_NE(config_error(r).find("10.x"), std::string::npos);
  r = request("llama3-8b", "b200", "nf4");
  r.gemm_dtype = GemmDtype::Fp4;
  EXPECT_NE(config_error(r).find("base_precision is 'nf4'"), std::string::npos);
  r.gemm_dtype = GemmDtype::Fp8;
  EXPECT_NE(config_error(r).find("gemm_dtype fp8"), std::string::npos);
  r.base_precision = BasePrecision::Fp8;
  EXPECT_NO_THROW(make_plan(r));
}

// The rule itself (model/gemm_dtype.h), as the engine applies it with its backend's capabilities.
TEST(GemmDtypePlan, ResolveNamesTheOptionTheBaseTheShapeAndTheDevice) {
  LlamaConfig c = preset_config("llama3-8b");
  ModelPlanOptions o;
  o.base_precision = BasePrecision::Nvfp4;
  o.gemm_dtype = GemmDtype::Fp4;
  EXPECT_EQ(resolve_gemm_dtype(o, c, {}), GemmDtype::Fp4);
  o.base_precision = BasePrecision::Mxfp4;
  EXPECT_EQ(resolve_gemm_dtype(o, c, {}), GemmDtype::Fp4);
  auto message = [&](const GemmCaps& caps) {
    try {
      resolve_gemm_dtype(o, c, caps);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Config);
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted";
    return std::string();
  };
  EXPECT_NE(message({true, false, "this GPU"}).find("gemm_dtype fp4: this GPU cannot run the block-scaled FP4 GEMM"),
            std::string::npos);
  o.base_shards = 2;
  EXPECT_NE(message({}).find("not implemented with sharding: fsdp"), std::string::npos);
  o.base_shards = 0;
  c.intermediate_size = 14320;  // down_proj in % 32 != 0
  EXPECT_NE(message({}).find("gemm_dtype fp4, projection down_proj (4096,14320): cuBLASLt's FP4 kernels need in % 32 == 0"),
            std::string::npos);
  c = preset_config("llama3-8b");
  o.gemm_dtype = GemmDtype::Fp8;
  EXPECT_NE(message({}).find("gemm_dtype fp8: reads an fp8 base as stored, but base_precision is 'mxfp4'"), std::string::npos);
  o.base_precision = BasePrecision::Fp8;
  EXPECT_NE(message({false, false, "this GPU"}).find("this GPU has no FP8 tensor cores"), std::string::npos);
  EXPECT_EQ(resolve_gemm_dtype(o, c, {}), GemmDtype::Fp8);
  o.gemm_dtype = GemmDtype::Bf16;
  EXPECT_EQ(resolve_gemm_dtype(o, c, {false, false, "x"}), GemmDtype::Bf16);
}
