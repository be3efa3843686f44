// Tensor: a non-owning, row-major view (pointer, dtype, shape) used at every op boundary.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"

namespace qlora {

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  std::array<int64_t, 4> shape{0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims) : data(d), dtype(t) {
    for (int64_t s : dims) shape[size_t(ndim++)] = s;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[size_t(i)];
    return ndim ? n : 0;
  }
  int64_t nbytes() const { return numel() * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[size_t(i < 0 ? ndim + i : i)]; }
  bool empty() const { return data == nullptr; }
  template <class T> T* as() const { return static_cast<T*>(data); }
  float* f32() const { return static_cast<float*>(data); }
  std::string shape_str() const;  // "(2,16,64)"
};

inline Tensor f32_view(float* p, std::initializer_list<int64_t> dims) { return Tensor(p, DType::F32, dims); }

}  // namespace qlora
