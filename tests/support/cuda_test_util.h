// Helpers for the CUDA-vs-CPU tests: the shared CUDA backend (or a skip), device buffers with
// dtype conversion and NaN poisoning, random inputs, and tolerance checks derived from bf16.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"

namespace qlora::test {

using Vec = std::vector<float>;

// bf16 keeps 8 significant bits: its unit roundoff u = 2^-8 bounds the relative error of one
// round-to-nearest (the spacing at 1.0 is 2^-7). For random data the rms of that error is about
// u/sqrt(3). Tolerances below are written as multiples of u.
inline constexpr double kBf16U = 1.0 / 256.0;

// One CUDA backend for the whole binary (context creation is slow); null with the reason when
// there is no usable device.
inline Backend* cuda_backend(std::string& why) {
  static std::string s_why;
  static std::unique_ptr<Backend> be = make_cuda_backend(&s_why);
  why = s_why;
  return be.get();
}
#define QLORA_REQUIRE_CUDA(var)                                           \
  std::string var##_why;                                                  \
  ::qlora::Backend* var = ::qlora::test::cuda_backend(var##_why);         \
  if (!var) GTEST_SKIP() << "no CUDA device: " << var##_why

// Which ops have a CUDA-vs-CPU case: CUDA_OP_TEST registers its op here, and the coverage test
// compares this set with backend_op_names().
inline std::set<std::string>& op_cases() {
  static std::set<std::string> s;
  return s;
}
inline bool register_op_case(const char* op) { return op_cases().insert(op).second || true; }
#define CUDA_OP_TEST(op, name)                                                                   \
  [[maybe_unused]] static const bool qlora_op_case_##op##_##name = ::qlora::test::register_op_case(#op); \
  TEST(CudaOps, op##_##name)

// QLORA_CUDA_TEST_SMALL=1 (the compute-sanitizer pass) shrinks every shape.
inline bool small_shapes() {
  const char* s = std::getenv("QLORA_CUDA_TEST_SMALL");
  return s && *s && std::string(s) != "0";
}

// Normal(0, sd) values away from zero, generated in parallel chunks (the 70B GEMM operands
// have a quarter of a billion elements). Deterministic for a given seed.
inline Vec randn(uint64_t seed, size_t n, float sd = 1.0f) {
  Vec v(n);
  const size_t chunk = size_t(1) << 20;
  const int64_t n_chunks = int64_t((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n_chunks; c++) {
    Rng rng(seed * 1000003u + uint64_t(c));
    for (size_t i = size_t(c) * chunk; i < std::min(n, size_t(c + 1) * chunk); i++) {
      float x;
      do x = rng.normal();
      while (std::fabs(x) < 1e-3f);
      v[i] = x * sd;
    }
  }
  return v;
}

// The values a BF16 tensor can hold: what the CPU reference must be given.
inline Vec round_bf16(Vec v) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(v.size()); i++) v[size_t(i)] = bf16_to_f32(f32_to_bf16(v[size_t(i)]));
  return v;
}

inline double rms(const Vec& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return v.empty() ? 0.0 : std::sqrt(s / double(v.size()));
}

// A device buffer of n elements of dtype F32 or BF16 (or I32), freed with its backend.
class DBuf {
 public:
  DBuf(Backend& be, DType dt, int64_t n) : be_(be), dt_(dt), n_(n) {
    p_ = be_.alloc(size_t(std::max<int64_t>(n, 1)) * size_t(dtype_size(dt)));
  }
  DBuf(Backend& be, DType dt, const Vec& host) : DBuf(be, dt, int64_t(host.size())) { upload(host); }
  ~DBuf() { be_.free(p_); }
  DBuf(const DBuf&) = delete;
  DBuf& operator=(const DBuf&) = delete;

  void upload(const Vec& host) {
    EXPECT_EQ(int64_t(host.size()), n_);
    if (dt_ == DType::F32) {
      be_.copy_to_device(p_, host.data(), host.size() * 4);
    } else {
      std::vector<uint16_t> h(host.size());
      for (size_t i = 0; i < h.size(); i++) h[i] = f32_to_bf16(host[i]);
      be_.copy_to_device(p_, h.data(), h.size() * 2);
    }
  }
  void upload_i32(const std::vector<int32_t>& host) { be_.copy_to_device(p_, host.data(), host.size() * 4); }
  Vec download() const {
    Vec out(static_cast<size_t>(n_));
    if (dt_ == DType::F32) {
      be_.copy_to_host(out.data(), p_, out.size() * 4);
    } else {
      std::vector<uint16_t> h(static_cast<size_t>(n_));
      be_.copy_to_host(h.data(), p_, h.size() * 2);
      for (size_t i = 0; i < h.size(); i++) out[i] = bf16_to_f32(h[i]);
    }
    return out;
  }
  // NaN everywhere, so an element the op forgets to write fails every comparison.
  void poison() {
    if (dt_ == DType::F32) {
      upload(Vec(size_t(n_), std::numeric_limits<float>::quiet_NaN()));
    } else {
      std::vector<uint16_t> h(size_t(n_), 0x7fc0);
      be_.copy_to_device(p_, h.data(), h.size() * 2);
    }
  }
  Tensor t(std::initializer_list<int64_t> dims) const { return Tensor(p_, dt_, dims); }
  Tensor t() const { return Tensor(p_, dt_, {n_}); }
  void* data() const { return p_; }
  const int32_t* i32() const { return static_cast<const int32_t*>(p_); }
  DType dtype() const { return dt_; }

 private:
  Backend& be_;
  DType dt_;
  int64_t n_;
  void* p_ = nullptr;
};

// |got - ref| <= rtol |ref| + atol_rms * rms(ref) + abs elementwise, and ||got - ref|| <= norm ||ref||
// + abs sqrt(n). `abs` is a floor for outputs that cancel to zero in exact arithmetic, set from the
// inputs' scale. Non-finite values never pass (a NaN-poisoned element the op did not write shows up).
struct Tol {
  double rtol, atol_rms, norm, abs = 0.0;
};

inline void expect_close(const std::string& what, const Vec& got, const Vec& ref, Tol tol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double r = rms(ref), atol = tol.atol_rms * r + tol.abs;
  int64_t bad = 0, nonfinite = 0;
  double err2 = 0, ref2 = 0, worst = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!std::isfinite(got[i])) {
      if (nonfinite++ < 3) ADD_FAILURE() << what << "[" << i << "] = " << got[i] << " (ref " << ref[i] << ")";
      continue;
    }
    const double e = std::fabs(double(got[i]) - double(ref[i]));
    err2 += e * e;
    ref2 += double(ref[i]) * ref[i];
    const double lim = tol.rtol * std::fabs(double(ref[i])) + atol;
    worst = std::max(worst, lim > 0 ? e / lim : (e > 0 ? INFINITY : 0.0));
    if (!(e <= lim) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << ref[i] << " err " << e << " limit " << lim;
  }
  EXPECT_EQ(nonfinite, 0) << what << ": non-finite outputs";
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " out of tolerance (worst " << worst
                    << "x the limit)";
  EXPECT_LE(std::sqrt(err2), tol.norm * std::sqrt(ref2) + tol.abs * std::sqrt(double(got.size())))
      << what << ": normwise error (relative " << (ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0) << ")";
}

inline void expect_equal(const std::string& what, const Vec& got, const Vec& ref) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &ref[i], 4);
    if (a != b && bad++ < 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << ref[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ";
}

}  // namespace qlora::test
