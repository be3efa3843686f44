// bitsandbytes NF4/FP4 (+ double quant), bit-exact with bitsandbytes 0.50's CPU path.
//
// What "the CPU path" is (bitsandbytes 0.50, read from bitsandbytes/backends/{default,cpu}/ops.py and
// checked against tests/fixtures/quant/bnb4.safetensors):
// - quantize_4bit runs the pure-torch default kernel: blocks of `blocksize` over the row-major
//   flattened weight; absmax = max|x| per block; full blocks scale by x * (1/max(absmax, 1e-38)),
//   the ragged tail block by x / max(absmax, 1e-38) (and stores that clamped absmax); clamp to
//   [-1, 1]; torch.bucketize on the float32 midpoints of the sorted code, so a tie goes to the lower
//   code; element 2j in the high nibble; an odd count pads with the code of 0.0.
// - double quant: offset = torch mean of the absmax; absmax - offset is quantized by the native
//   CPU 8-bit kernel (blocks of 256, dynamic map, 65536-bin lookup table).
// - dequantize: code[nibble] * absmax in f32; nested: code8[q] * nested_absmax + offset.
// bitsandbytes on CUDA differs in corner cases (see reference/quant_formats.md): FP4 thresholds are
// decimal literals a few ulp off the midpoints, --use_fast_math reciprocals, tail blocks use the
// reciprocal too, all-zero blocks give code 0, and the 8-bit step uses a binary search.
#include "quant/bnb4.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/formats_impl.h"

namespace qlora {

using detail::ceil_div;

namespace {

constexpr float kNF4[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// get_4bit_type("fp4"): raw magnitudes {0, 0.0625, 8, 12, 4, 6, 2, 3}, bit 3 = sign, divided by 12
// in f32. Code 8 is +0 (Python's literal -0 is the integer 0).
constexpr float kFP4[16] = {
    0.0f,         0.0625f / 12.0f,  8.0f / 12.0f,  1.0f,          4.0f / 12.0f,  6.0f / 12.0f,
    2.0f / 12.0f, 3.0f / 12.0f,     0.0f,          -0.0625f / 12.0f, -8.0f / 12.0f, -1.0f,
    -4.0f / 12.0f, -6.0f / 12.0f,   -2.0f / 12.0f, -3.0f / 12.0f};

// create_dynamic_map(signed=True) as f32 bits, printed from bitsandbytes 0.50.2 under torch 2.15
// (checked against the fixture by tests/quant/test_bnb4.cpp).
constexpr uint32_t kDynamicMapBits[256] = {
    0xbf7e3333, 0xbf7a999a, 0xbf770000, 0xbf736666, 0xbf6fcccd, 0xbf6c3333, 0xbf68999a, 0xbf650000,
    0xbf616666, 0xbf5dcccd, 0xbf5a3333, 0xbf56999a, 0xbf530000, 0xbf4f6666, 0xbf4bcccd, 0xbf483333,
    0xbf44999a, 0xbf410000, 0xbf3d6666, 0xbf39cccd, 0xbf363334, 0xbf32999a, 0xbf2f0000, 0xbf2b6666,
    0xbf27cccd, 0xbf243334, 0xbf20999a, 0xbf1d0000, 0xbf196666, 0xbf15cccd, 0xbf123334, 0xbf0e999a,
    0xbf0b0000, 0xbf076666, 0xbf03cccc, 0xbf003333, 0xbef93332, 0xbef20000, 0xbeeacccc, 0xbee3999a,
    0xbedc6666, 0xbed53333, 0xbece0000, 0xbec6cccc, 0xbebf999a, 0xbeb86666, 0xbeb13333, 0xbeaa0000,
    0xbea2cccc, 0xbe9b999a, 0xbe946666, 0xbe8d3334, 0xbe860000, 0xbe7d9999, 0xbe6f3333, 0xbe60cccd,
    0xbe526666, 0xbe440000, 0xbe35999a, 0xbe273333, 0xbe18cccd, 0xbe0a6666, 0xbdf80000, 0xbddb3334,
    0xbdc9eb85, 0xbdc428f7, 0xbdbe6667, 0xbdb8a3d7, 0xbdb2e148, 0xbdad1eb8, 0xbda75c2a, 0xbda1999a,
    0xbd9bd70a, 0xbd96147b, 0xbd9051eb, 0xbd8a8f5d, 0xbd84cccd, 0xbd7e147b, 0xbd728f5d, 0xbd670a3d,
    0xbd5b851f, 0xbd500000, 0xbd447ae1, 0xbd38f5c3, 0xbd2d70a3, 0xbd21eb85, 0xbd166667, 0xbd0ae148,
    0xbcfeb852, 0xbce7ae15, 0xbcd0a3d7, 0xbcb9999a, 0xbca28f5d, 0xbc8b851f, 0xbc68f5c3, 0xbc3ae148,
    0xbc1f3b64, 0xbc160418, 0xbc0ccccd, 0xbc039581, 0xbbf4bc6a, 0xbbe24dd3, 0xbbcfdf3b, 0xbbbd70a4,
    0xbbab020d, 0xbb989374, 0xbb8624dd, 0xbb676c8a, 0xbb428f5c, 0xbb1db22d, 0xbaf1a9fc, 0xbaa7ef9d,
    0xba7765ff, 0xba59e83e, 0xba3c6a80, 0xba1eecc1, 0xba016f01, 0xb9c7e283, 0xb98ce705, 0xb923d70b,
    0xb8ba1f4b, 0xb88aefb3, 0xb8378034, 0xb7b24206, 0xb70205ff, 0xb65a1a94, 0xb513a3b7, 0x00000000,
    0x3513a3b7, 0x365a1a94, 0x370205ff, 0x37b24206, 0x38378034, 0x388aefb3, 0x38ba1f4b, 0x3923d70b,
    0x398ce705, 0x39c7e283, 0x3a016f01, 0x3a1eecc1, 0x3a3c6a80, 0x3a59e83e, 0x3a7765ff, 0x3aa7ef9d,
    0x3af1a9fc, 0x3b1db22d, 0x3b428f5c, 0x3b676c8a, 0x3b8624dd, 0x3b989374, 0x3bab020d, 0x3bbd70a4,
    0x3bcfdf3b, 0x3be24dd3, 0x3bf4bc6a, 0x3c039581, 0x3c0ccccd, 0x3c160418, 0x3c1f3b64, 0x3c3ae148,
    0x3c68f5c3, 0x3c8b851f, 0x3ca28f5d, 0x3cb9999a, 0x3cd0a3d7, 0x3ce7ae15, 0x3cfeb852, 0x3d0ae148,
    0x3d166667, 0x3d21eb85, 0x3d2d70a3, 0x3d38f5c3, 0x3d447ae1, 0x3d500000, 0x3d5b851f, 0x3d670a3d,
    0x3d728f5d, 0x3d7e147b, 0x3d84cccd, 0x3d8a8f5d, 0x3d9051eb, 0x3d96147b, 0x3d9bd70a, 0x3da1999a,
    0x3da75c2a, 0x3dad1eb8, 0x3db2e148, 0x3db8a3d7, 0x3dbe6667, 0x3dc428f7, 0x3dc9eb85, 0x3ddb3334,
    0x3df80000, 0x3e0a6666, 0x3e18cccd, 0x3e273333, 0x3e35999a, 0x3e440000, 0x3e526666, 0x3e60cccd,
    0x3e6f3333, 0x3e7d9999, 0x3e860000, 0x3e8d3334, 0x3e946666, 0x3e9b999a, 0x3ea2cccc, 0x3eaa0000,
    0x3eb13333, 0x3eb86666, 0x3ebf999a, 0x3ec6cccc, 0x3ece0000, 0x3ed53333, 0x3edc6666, 0x3ee3999a,
    0x3eeacccc, 0x3ef20000, 0x3ef93332, 0x3f003333, 0x3f03cccc, 0x3f076666, 0x3f0b0000, 0x3f0e999a,
    0x3f123334, 0x3f15cccd, 0x3f196666, 0x3f1d0000, 0x3f20999a, 0x3f243334, 0x3f27cccd, 0x3f2b6666,
    0x3f2f0000, 0x3f32999a, 0x3f363334, 0x3f39cccd, 0x3f3d6666, 0x3f410000, 0x3f44999a, 0x3f483333,
    0x3f4bcccd, 0x3f4f6666, 0x3f530000, 0x3f56999a, 0x3f5a3333, 0x3f5dcccd, 0x3f616666, 0x3f650000,
    0x3f68999a, 0x3f6c3333, 0x3f6fcccd, 0x3f736666, 0x3f770000, 0x3f7a999a, 0x3f7e3333, 0x3f800000,
};

constexpr int64_t kNestedBlock = 256;
const float kTinyAbsmax = static_cast<float>(1e-38);  // torch clamp(min=1e-38) on a f32 tensor

// Decision table of one 4-bit type: bucket b in [bounds[b-1], bounds[b]) -> code order[b].
struct Bucketizer {
  std::array<uint8_t, 16> order;
  std::array<float, 15> bounds;
  explicit Bucketizer(const float* code) {
    for (int i = 0; i < 16; i++) order[size_t(i)] = uint8_t(i);
    // Stable sort = torch.argsort's order here: FP4's two zeros stay code 0 then code 8, which is
    // why bitsandbytes sends tiny positive values to code 8.
    std::stable_sort(order.begin(), order.end(), [&](uint8_t a, uint8_t b) { return code[a] < code[b]; });
    for (int i = 0; i < 15; i++) bounds[size_t(i)] = (code[order[size_t(i)]] + code[order[size_t(i) + 1]]) / 2.0f;
  }
  // torch.bucketize(right=False): index of the first bound >= s, i.e. ties go to the lower bucket.
  uint8_t operator()(float s) const {
    int b = 0;
    while (b < 15 && bounds[size_t(b)] < s) b++;
    return order[size_t(b)];
  }
};

const Bucketizer& bucketizer(QuantFormat f) {
  static const Bucketizer nf4(kNF4), fp4(kFP4);
  return f == QuantFormat::NF4 ? nf4 : fp4;
}

// torch's CPU reduction order (aten/src/ATen/native/cpu/SumKernel.cpp: multi_row_sum with four
// cascade levels inside row_sum with 4-way ILP) for f32 scalars or 8-lane vectors.
struct Lanes8 {
  float v[8] = {};
  Lanes8& operator+=(const Lanes8& o) {
    for (int k = 0; k < 8; k++) v[k] += o.v[k];
    return *this;
  }
};

int64_t ceil_log2(int64_t x) {
  int64_t r = 0;
  while ((int64_t(1) << r) < x) r++;
  return r;
}

template <class Acc, class Load>
Acc torch_row_sum(int64_t size, Load load) {
  constexpr int64_t ilp = 4, levels = 4;
  const int64_t rows = size / ilp;  // (rows, ilp) view of the input
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(rows) / levels);
  const int64_t level_step = int64_t(1) << level_power, level_mask = level_step - 1;
  Acc acc[levels][ilp] = {};
  int64_t i = 0;
  while (i + level_step <= rows) {
    for (int64_t j = 0; j < level_step; j++, i++)
      for (int64_t k = 0; k < ilp; k++) acc[0][k] += load(i * ilp + k);
    for (int64_t j = 1; j < levels; j++) {
      for (int64_t k = 0; k < ilp; k++) {
        acc[j][k] += acc[j - 1][k];
        acc[j - 1][k] = Acc{};
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < rows; i++)
    for (int64_t k = 0; k < ilp; k++) acc[0][k] += load(i * ilp + k);
  for (int64_t j = 1; j < levels; j++)
    for (int64_t k = 0; k < ilp; k++) acc[0][k] += acc[j][k];
  for (int64_t t = rows * ilp; t < size; t++) acc[0][0] += load(t);
  for (int64_t k = 1; k < ilp; k++) acc[0][0] += acc[0][k];
  return acc[0][0];
}

float torch_sum_f32(const float* x, int64_t n) {
  constexpr int64_t lanes = 8;
  if (n < lanes) return torch_row_sum<float>(n, [&](int64_t i) { return x[i]; });
  const int64_t nvec = n / lanes;
  const Lanes8 vacc = torch_row_sum<Lanes8>(nvec, [&](int64_t i) {
    Lanes8 l;
    std::memcpy(l.v, x + i * lanes, sizeof(l.v));
    return l;
  });
  float s = 0.0f;
  for (int64_t i = nvec * lanes; i < n; i++) s += x[i];
  for (int64_t k = 0; k < lanes; k++) s += vacc.v[k];
  return s;
}

}  // namespace

const float* nf4_code() { return kNF4; }
const float* fp4_code() { return kFP4; }

const float* dynamic_map_signed() {
  static const std::array<float, 256> map = [] {
    std::array<float, 256> m{};
    std::memcpy(m.data(), kDynamicMapBits, sizeof(kDynamicMapBits));
    return m;
  }();
  return map.data();
}

float bnb_absmax_mean(const float* absmax, int64_t n) {
  QLORA_ASSERT(n > 0);
  return torch_sum_f32(absmax, n) / float(n);
}

void bnb_quantize_blockwise_8bit(const float* x, int64_t n, int blocksize, const float* code256,
                                 uint8_t* q, float* absmax) {
  // lut[j]: nearest code (ties to the lower one) to the centre of bin j, j/65535*2-1.
  float mid[255];
  for (int i = 0; i < 255; i++) mid[i] = (code256[i] + code256[i + 1]) / 2.0f;
  std::vector<uint8_t> lut(65536);  // (65536)
  int c = 0;
  for (int j = 0; j < 65536; j++) {
    const float v = float(j) / 65535.0f * 2.0f - 1.0f;
    while (c < 255 && mid[c] < v) c++;
    lut[size_t(j)] = uint8_t(c);
  }
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += blocksize, blk++) {
    const int64_t b1 = std::min<int64_t>(n, b0 + blocksize);
    float am = 0.0f;
    for (int64_t i = b0; i < b1; i++) am = std::fmax(am, std::fabs(x[i]));
    absmax[blk] = am;
    const float inv = 1.0f / am;
    for (int64_t i = b0; i < b1; i++) {
      const float v = x[i] * inv;
      if (std::isnan(v)) {  // 0 * inf in an all-zero block: bitsandbytes writes code 0
        q[i] = 0;
        continue;
      }
      const float t = (v + 1.0f) * 0.5f * 65535.0f + 0.5f;
      const int64_t j = t <= 0.0f ? 0 : std::min<int64_t>(65535, int64_t(t));
      q[i] = lut[size_t(j)];
    }
  }
}

float bnb_block_absmax(const QuantizedTensor& q, int64_t block) {
  static_assert(kNestedBlock == 256);
  if (!q.params.double_quant) return q.absmax[size_t(block)];
  return bnb_block_absmax(nullptr, q.absmax_q.data(), q.nested_absmax.data(), q.nested_code.data(), q.offset, block);
}

namespace detail {

void quantize_bnb4(const float* w, QuantizedTensor& q) {
  const int64_t n = q.numel(), bs = q.params.blocksize;
  const int64_t n_blocks = ceil_div(n, bs), n_full = n / bs;
  const Bucketizer& bucket = bucketizer(q.params.format);
  std::vector<float> absmax(static_cast<size_t>(n_blocks));  // (n_blocks)
  q.data.assign(size_t((n + 1) / 2), 0);
  // Blocks start at even elements (blocksize is even), so no two blocks share a byte.
#pragma omp parallel for schedule(static) if (n > detail::kOmpMinElems)
  for (int64_t b = 0; b < n_blocks; b++) {
    const int64_t e0 = b * bs, e1 = std::min(n, e0 + bs);
    float am = 0.0f;
    for (int64_t i = e0; i < e1; i++) am = std::max(am, std::fabs(w[i]));
    const bool full = b < n_full;
    const float clamped = std::max(am, kTinyAbsmax);
    const float inv = 1.0f / clamped;
    absmax[size_t(b)] = full ? am : clamped;
    for (int64_t i = e0; i < e1; i++) {
      const float s = std::clamp(full ? w[i] * inv : w[i] / clamped, -1.0f, 1.0f);
      const uint8_t code = bucket(s);
      q.data[size_t(i / 2)] |= (i % 2 == 0) ? uint8_t(code << 4) : code;
    }
  }
  if (n % 2 == 1) q.data.back() |= bucket(0.0f);  // padding element

  if (!q.params.double_quant) {
    q.absmax = std::move(absmax);
    return;
  }
  q.offset = bnb_absmax_mean(absmax.data(), n_blocks);
  for (float& a : absmax) a -= q.offset;
  q.absmax_q.resize(size_t(n_blocks));
  q.nested_absmax.resize(size_t(ceil_div(n_blocks, kNestedBlock)));
  q.nested_code.assign(dynamic_map_signed(), dynamic_map_signed() + 256);
  bnb_quantize_blockwise_8bit(absmax.data(), n_blocks, int(kNestedBlock), q.nested_code.data(),
                              q.absmax_q.data(), q.nested_absmax.data());
}

void dequantize_bnb4(const QuantizedTensor& q, int64_t r0, int64_t r1, float* out) {
  const float* code = q.params.format == QuantFormat::NF4 ? kNF4 : kFP4;
  const int64_t bs = q.params.blocksize, cols = q.cols;
#pragma omp parallel for schedule(static) if ((r1 - r0) * cols > kOmpMinElems)
  for (int64_t r = r0; r < r1; r++) {
    int64_t cur_block = -1;
    float am = 0.0f;
    for (int64_t i = r * cols; i < (r + 1) * cols; i++) {
      if (i / bs != cur_block) {
        cur_block = i / bs;
        am = bnb_block_absmax(q, cur_block);
      }
      const uint8_t byte = q.data[size_t(i / 2)];
      const uint8_t nib = (i % 2 == 0) ? uint8_t(byte >> 4) : uint8_t(byte & 0x0f);
      out[i - r0 * cols] = code[nib] * am;
    }
  }
}

}  // namespace detail

}  // namespace qlora
