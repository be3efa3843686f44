// Views of a planned buffer with other rows or another shape (the data is not touched).
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace qlora {

// The first n rows.
inline Tensor with_rows(Tensor t, int64_t n) {
  t.shape[0] = n;
  return t;
}
// Rows [r0, r0 + n) of a row-major (rows, cols) tensor.
inline Tensor row_slice(Tensor t, int64_t r0, int64_t n) {
  const int64_t cols = t.ndim > 1 ? t.numel() / t.shape[0] : 1;
  t.data = static_cast<char*>(t.data) + r0 * cols * int64_t(dtype_size(t.dtype));
  t.shape[0] = n;
  return t;
}
// Columns [0, cols) of a (rows, wide) workspace viewed as a dense (rows, cols) matrix.
inline Tensor as_matrix(Tensor t, int64_t rows, int64_t cols) {
  t.ndim = 2;
  t.shape = {rows, cols, 0, 0};
  return t;
}

}  // namespace qlora
