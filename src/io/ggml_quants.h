// ggml tensor types as stored in GGUF: a traits table (id, name, block size, bytes) and dequantization to f32.
#pragma once
#include <cstdint>
#include <string>

namespace qlora {

// Type ids are the on-disk values of ggml's `enum ggml_type` (ids 4, 5 and 31-33 were removed upstream).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  const char* name;     // ggml spelling ("Q4_K")
  int64_t block_size;   // elements per block (1 for plain types)
  int64_t block_bytes;  // bytes per block
  bool can_dequantize;  // dequantize_row() handles it
};

// nullptr when `id` is not a ggml type we know the size of.
const GgmlTypeTraits* ggml_type_traits(uint32_t id);
const GgmlTypeTraits& ggml_type_traits(GgmlType t);
inline const char* ggml_type_name(GgmlType t) { return ggml_type_traits(t).name; }
// "Q4_K" for known ids, "type id 99" otherwise.
std::string ggml_type_label(uint32_t id);

// Bytes of n elements of type t; Error(Shape) when n is not a whole number of blocks.
int64_t ggml_row_bytes(GgmlType t, int64_t n);

// The types dequantize_row() handles, by name, space-separated (for messages).
std::string ggml_dequantizable_types();

// Dequantizes n elements (a whole number of blocks) of type t from src into dst.
// Supported: F32 F16 BF16 F64 I8 I16 I32 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4.
// Error(Unsupported) names the type otherwise; Error(Shape) when n is not a multiple of the block.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// MXFP4 in ggml's blocks and in the OCP layout gpt-oss's checkpoints ship (the engine's MXFP4
// weights hold the latter): per 32 elements the same E8M0 scale byte and the same E2M1 codes, ggml
// storing the scale and then 16 bytes with element j in the low nibble of byte j and element j + 16
// in the high one, the OCP layout the scales apart and 16 code bytes with element 2i in the low
// nibble of byte i and 2i + 1 in the high one. n elements (a multiple of 32): blocks of n / 32 * 17
// bytes <-> codes of n / 2 bytes and scales of n / 32 bytes. Lossless both ways.
void mxfp4_from_ggml(const uint8_t* blocks, int64_t n, uint8_t* codes, uint8_t* scales);
void mxfp4_to_ggml(const uint8_t* codes, const uint8_t* scales, int64_t n, uint8_t* blocks);

}  // namespace qlora
