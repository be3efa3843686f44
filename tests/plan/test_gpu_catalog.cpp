// GPU catalog: required entries, sane figures, name resolution and the custom: syntax.
#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "core/error.h"
#include "plan/gpu_catalog.h"

using namespace qlora;

namespace {

std::string error_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GpuCatalog, HasEveryRequestedDevice) {
  for (const char* n : {"a100-40gb", "a100-80gb", "h100-sxm", "h100-nvl", "h200", "b200", "b200-180gb", "b300",
                        "gb200", "gb300", "rtx4090", "rtx5090", "mi300x", "mi325x", "gaudi3"})
    EXPECT_NO_THROW(resolve_gpu(n)) << n;
  EXPECT_EQ(resolve_gpu("b200").mem_bytes, int64_t(192) << 30);
  EXPECT_EQ(resolve_gpu("b200-180gb").mem_bytes, int64_t(180) << 30);
  EXPECT_EQ(resolve_gpu("H100").name, "h100-sxm");       // alias, case-insensitive
  EXPECT_EQ(resolve_gpu("RTX 4090").name, "rtx4090");    // spaces and dashes ignored
  EXPECT_DOUBLE_EQ(resolve_gpu("h100").bf16_tflops, 989.4);  // perf_anchors §8 datasheet value
}

TEST(GpuCatalog, FiguresAreConsistent) {
  std::set<std::string> names;
  for (const auto& g : gpu_catalog()) {
    EXPECT_TRUE(names.insert(g.name).second) << "duplicate " << g.name;
    EXPECT_GE(g.mem_bytes, int64_t(24) << 30) << g.name;
    EXPECT_GT(g.mem_bw, 1e12) << g.name;
    EXPECT_GT(g.bf16_tflops, 100) << g.name;
    // Lower precision never runs slower than bf16 where it exists.
    if (g.fp8_tflops > 0) {
      EXPECT_GE(g.fp8_tflops, g.bf16_tflops) << g.name;
    }
    if (g.fp4_tflops > 0) {
      EXPECT_GE(g.fp4_tflops, g.fp8_tflops) << g.name;
    }
    EXPECT_GT(g.link_bw, 0) << g.name;
    EXPECT_GT(g.net_bw, 0) << g.name;
    EXPECT_GT(g.host_bw, 0) << g.name;
    EXPECT_FALSE(g.source.empty()) << g.name;
    for (const auto& a : g.aliases) EXPECT_EQ(resolve_gpu(a).name, g.name) << a;
  }
  // FP4 tensor cores only from Blackwell on; Hopper and AMD MI300 have none.
  EXPECT_EQ(resolve_gpu("h200").fp4_tflops, 0);
  EXPECT_EQ(resolve_gpu("mi300x").fp4_tflops, 0);
  EXPECT_EQ(resolve_gpu("a100").fp8_tflops, 0);
  EXPECT_GT(resolve_gpu("gb300").fp4_tflops, resolve_gpu("b200").fp4_tflops);
}

TEST(GpuCatalog, UnknownNameListsKnownAndSuggests) {
  std::string m = error_text([] { resolve_gpu("h1000"); });
  EXPECT_NE(m.find("unknown GPU 'h1000'"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean 'h100-sxm'"), std::string::npos) << m;
  EXPECT_NE(m.find("b200"), std::string::npos) << m;       // the list of known GPUs
  EXPECT_NE(m.find("custom:"), std::string::npos) << m;    // and how to describe another
  m = error_text([] { resolve_gpu("mi350x"); });
  EXPECT_NE(m.find("did you mean 'mi300x'"), std::string::npos) << m;
  m = error_text([] { resolve_gpu("tpu-v5p-pod"); });       // nothing close: list only
  EXPECT_EQ(m.find("did you mean"), std::string::npos) << m;
  EXPECT_NE(m.find("known GPUs"), std::string::npos) << m;
}

TEST(GpuCatalog, CustomSpec) {
  GpuSpec g = resolve_gpu("custom:mem=80GB,bw=3.35TB/s,bf16=989,fp8=1979,link=450GB/s,name=myh100");
  EXPECT_EQ(g.mem_bytes, int64_t(80) << 30);  // GB is binary like the catalog
  EXPECT_DOUBLE_EQ(g.mem_bw, 3.35e12);
  EXPECT_DOUBLE_EQ(g.bf16_tflops, 989);
  EXPECT_DOUBLE_EQ(g.fp8_tflops, 1979);
  EXPECT_DOUBLE_EQ(g.fp4_tflops, 0);
  EXPECT_DOUBLE_EQ(g.link_bw, 450e9);
  EXPECT_EQ(g.name, "myh100");
  GpuSpec t = resolve_gpu("custom: mem = 1.5TB , bw=900GB/s, bf16=100 ");
  EXPECT_EQ(t.mem_bytes, int64_t(1536) << 30);
  EXPECT_DOUBLE_EQ(t.mem_bw, 900e9);
}

TEST(GpuCatalog, CustomSpecErrors) {
  std::string m = error_text([] { resolve_gpu("custom:mem=80GB,bf16=989"); });
  EXPECT_NE(m.find("missing required key 'bw'"), std::string::npos) << m;
  m = error_text([] { resolve_gpu("custom:mem=80XB,bw=3TB/s,bf16=989"); });
  EXPECT_NE(m.find("unknown unit 'xb'"), std::string::npos) << m;
  m = error_text([] { resolve_gpu("custom:mem=80GB,bw=3TB/s,bf16=989,fp9=1"); });
  EXPECT_NE(m.find("unknown key 'fp9'"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean 'fp8'"), std::string::npos) << m;
  m = error_text([] { resolve_gpu("custom:mem=80GB,bw=fast,bf16=989"); });
  EXPECT_NE(m.find("not a non-negative number"), std::string::npos) << m;
  m = error_text([] { resolve_gpu("custom:mem80GB"); });
  EXPECT_NE(m.find("not key=value"), std::string::npos) << m;
}
