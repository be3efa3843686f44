// CPU dequantize op: every quantized format of the traits table, packed as the arena stores it,
// equals the scalar reference bit for bit (odd sizes, partial blocks, with and without double quant).
#include <cstring>

#include "backend_test_util.h"
#include "core/error.h"
#include "quant/quant_layout.h"
#include "quant/quantize.h"

namespace qlora::test {
namespace {

void check_format(Backend& be, QuantParams p, int64_t rows, int64_t cols, uint64_t seed) {
  Rng rng(seed);
  Vec w = randn(rng, size_t(rows * cols), 0.05f);
  w[3] = 0.9f;  // one outlier block
  const QuantizedTensor q = quantize_ref(w.data(), rows, cols, p);
  std::vector<uint8_t> blob(size_t(quant_layout(q.params, rows, cols).total));
  pack_quantized(q, blob.data());
  Vec want(w.size()), got(w.size(), 7.0f);  // "=": the op overwrites whatever is there
  dequantize_ref(q, want.data());
  be.dequantize({f32_view(got.data(), {rows, cols}), blob.data(), p, rows, cols});
  const std::string what = std::string(quant_format_name(p.format)) + (p.double_quant ? " dq" : "") + " " +
                           std::to_string(rows) + "x" + std::to_string(cols) + " bs " + std::to_string(p.blocksize);
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && bad++ < 3)
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << " want " << want[i];
  EXPECT_EQ(bad, 0u) << what;
  // A real weight: never all zeros after the round trip.
  EXPECT_NE(*std::max_element(got.begin(), got.end()), 0.0f) << what;
}

TEST(CpuOps, dequantize_EveryFormatEqualsReference) {
  auto be = cpu();
  uint64_t seed = 1;
  for (const auto& t : quant_formats()) {
    for (bool dq : {false, true}) {
      if (dq && t.format != QuantFormat::NF4 && t.format != QuantFormat::FP4) continue;
      QuantParams p;
      p.format = t.format;
      p.double_quant = dq;
      check_format(*be, p, 96, 576, seed++);   // whole blocks, above the OpenMP threshold
      check_format(*be, p, 7, 45, seed++);     // odd: partial blocks and a half byte at the end
      if (t.format == QuantFormat::NF4) {
        p.blocksize = 128;
        check_format(*be, p, 33, 300, seed++);
      }
    }
  }
}

TEST(CpuOps, dequantize_BadArgumentsAreErrors) {
  auto be = cpu();
  Vec out(12);
  QuantParams p;
  p.format = QuantFormat::NF4;
  EXPECT_THROW(be->dequantize({f32_view(out.data(), {3, 4}), nullptr, p, 3, 4}), Error);  // no source
  std::vector<uint8_t> blob(1024);
  EXPECT_THROW(be->dequantize({f32_view(out.data(), {3, 4}), blob.data(), p, 4, 4}), Error);  // shape
  p.blocksize = 48;  // not a bnb block size
  EXPECT_THROW(be->dequantize({f32_view(out.data(), {3, 4}), blob.data(), p, 3, 4}), Error);
}

}  // namespace
}  // namespace qlora::test
