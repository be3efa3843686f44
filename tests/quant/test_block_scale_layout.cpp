// quant/block_scale_layout.h against the cuBLAS documentation's description of the 1D block
// scaling factors layout, element by element (the harness decodes with the same function, so its
// MXFP8 test alone could not catch a wrong formula).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "quant/block_scale_layout.h"

namespace qlora {
namespace {

TEST(BlockScaleLayout, OffsetsInsideAndAcrossTiles) {
  // A 128 x 4 tile is 512 bytes: 32-row groups of 16 bytes, each holding 4 row-quarters x 4 blocks.
  EXPECT_EQ(block_scale_offset(0, 0, 4), 0);
  EXPECT_EQ(block_scale_offset(0, 3, 4), 3);
  EXPECT_EQ(block_scale_offset(1, 0, 4), 16);
  EXPECT_EQ(block_scale_offset(31, 0, 4), 31 * 16);
  EXPECT_EQ(block_scale_offset(32, 0, 4), 4);
  EXPECT_EQ(block_scale_offset(96, 2, 4), 12 + 2);
  EXPECT_EQ(block_scale_offset(127, 3, 4), 511);
  // The next 4 blocks of the same rows are the next tile; the next 128 rows follow all of those.
  EXPECT_EQ(block_scale_offset(0, 4, 8), 512);
  EXPECT_EQ(block_scale_offset(128, 0, 8), 1024);
  EXPECT_EQ(block_scale_offset(129, 5, 8), 1536 + 16 + 1);
  // Padding: 130 rows of 3 blocks take two full tiles.
  EXPECT_EQ(block_scale_tiled_bytes(130, 3), 1024);
  EXPECT_EQ(block_scale_tiled_bytes(128, 4), 512);
}

TEST(BlockScaleLayout, TilingIsAPermutationIntoThePaddedArray) {
  const int64_t rows = 200, kb = 7;
  std::set<int64_t> seen;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < kb; b++) {
      const int64_t o = block_scale_offset(r, b, kb);
      ASSERT_GE(o, 0);
      ASSERT_LT(o, block_scale_tiled_bytes(rows, kb));
      EXPECT_TRUE(seen.insert(o).second) << r << "," << b;
    }
  std::vector<uint8_t> s(size_t(rows * kb));
  for (size_t i = 0; i < s.size(); i++) s[i] = uint8_t(1 + i % 251);
  const auto t = tile_block_scales(s.data(), rows, kb);
  EXPECT_EQ(t[size_t(block_scale_offset(150, 6, kb))], s[size_t(150 * kb + 6)]);
  EXPECT_EQ(t[size_t(block_scale_tiled_bytes(rows, kb) - 1)], 0) << "padding is zero";
}

// tools/make_block_scale_fixtures.py writes the layout from NVIDIA's description as array reshapes
// (checked there against nvmath-python's documented example offsets), independently of this C++.
TEST(BlockScaleLayout, EqualsTheLayoutWrittenFromTheCublasDocumentation) {
  std::ifstream f(std::string(QLORA_FIXTURES) + "/quant/block_scale_layout.json");
  ASSERT_TRUE(f) << "tests/fixtures/quant/block_scale_layout.json missing";
  const auto j = nlohmann::json::parse(f);
  ASSERT_GE(j.at("cases").size(), 5u);
  for (const auto& c : j.at("cases")) {
    const int64_t outer = c.at("outer").get<int64_t>(), kb = c.at("k_blocks").get<int64_t>();
    const auto want = c.at("tiled").get<std::vector<int>>();
    std::vector<uint8_t> s(size_t(outer * kb));
    for (size_t i = 0; i < s.size(); i++) s[i] = uint8_t(1 + i % 251);
    const auto got = tile_block_scales(s.data(), outer, kb);
    ASSERT_EQ(got.size(), want.size()) << outer << "x" << kb;
    for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(int(got[i]), want[i]) << outer << "x" << kb << " byte " << i;
  }
}

}  // namespace
}  // namespace qlora
