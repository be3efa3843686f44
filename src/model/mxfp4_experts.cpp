// gpt-oss's MXFP4 expert blocks read as shipped (model/mxfp4_experts.h).
#include "model/mxfp4_experts.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace qlora {

QuantParams mxfp4_expert_params() {
  QuantParams p;
  p.format = QuantFormat::MXFP4;
  p.blocksize = 32;
  p.mx_scale_rule = MxScaleRule::Floor;
  return p;
}

QuantizedTensor mxfp4_rows(const QuantizedTensor& q, int64_t first, int64_t count, int64_t step) {
  if (q.params.format != QuantFormat::MXFP4 || q.cols % 32 != 0 || first < 0 || count < 0 ||
      (count > 0 && first + (count - 1) * step >= q.rows))
    fail(ErrorKind::Internal, "mxfp4_rows", "rows outside the weight, or not MXFP4 with whole blocks");
  QuantizedTensor r;
  r.params = q.params;
  r.rows = count;
  r.cols = q.cols;
  const int64_t db = q.cols / 2, sb = q.cols / 32;
  r.data.resize(size_t(count * db));
  r.scales.resize(size_t(count * sb));
  for (int64_t i = 0; i < count; i++) {
    const int64_t src = first + i * step;
    std::copy_n(q.data.begin() + src * db, db, r.data.begin() + i * db);
    std::copy_n(q.scales.begin() + src * sb, sb, r.scales.begin() + i * sb);
  }
  return r;
}

// The stack `name` from its _blocks and _scales, checked against each other; out and in are the
// per-expert matrix's rows and columns.
static QuantizedTensor read_blocks(const SafetensorsArchive& ar, const std::string& name, int64_t& experts,
                                   int64_t& out, int64_t& in) {
  const TensorInfo& b = ar.get(name + "_blocks");
  const TensorInfo& s = ar.get(name + "_scales");
  const std::string where = ar.path() + ": tensor '" + name + "_blocks'";
  if (b.dtype != DType::U8 || s.dtype != DType::U8)
    fail(ErrorKind::Format, where, "MXFP4 blocks and scales must be U8", "is this a gpt-oss checkpoint as the Hub ships it?");
  if (b.shape.size() != 4 || b.shape[3] != 16 || s.shape.size() != 3 ||
      !std::equal(s.shape.begin(), s.shape.end(), b.shape.begin()))
    fail(ErrorKind::Format, where,
         "has shape " + shape_str(b.shape) + " beside scales " + shape_str(s.shape) +
             "; expected (experts, rows, blocks, 16) and (experts, rows, blocks)");
  experts = b.shape[0], out = b.shape[1], in = b.shape[2] * 32;
  QuantizedTensor q;
  q.params = mxfp4_expert_params();
  q.rows = experts * out;
  q.cols = in;
  const auto* bp = static_cast<const uint8_t*>(b.data);
  const auto* sp = static_cast<const uint8_t*>(s.data);
  q.data.assign(bp, bp + b.nbytes);
  q.scales.assign(sp, sp + s.nbytes);
  ar.release_pages(name + "_");  // the blocks and scales, copied
  return q;
}

TensorSource mxfp4_experts_source(std::shared_ptr<const SafetensorsArchive> ar, const std::string& description) {
  TensorSource s;
  s.description = description;
  s.stored_expert_quant = mxfp4_expert_params();
  s.has = [ar](const std::string& n) { return ar->has(n) || ar->has(n + "_blocks"); };
  s.read_f32 = [ar](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    if (ar->has(n) || !ar->has(n + "_blocks")) {
      ar->read_f32(n, dst, shape);
      ar->release_pages(n);
      return;
    }
    int64_t experts = 0, out = 0, in = 0;
    const QuantizedTensor q = read_blocks(*ar, n, experts, out, in);
    if (shape != std::vector<int64_t>{experts, in, out})
      fail(ErrorKind::Shape, ar->path() + ": tensor '" + n + "_blocks'",
           "holds a " + shape_str({experts, in, out}) + " expert stack, expected " + shape_str(shape));
    std::vector<float> rows(size_t(out * in));  // one expert, (out, in)
    for (int64_t e = 0; e < experts; e++) {
      dequantize_rows_ref(q, e * out, (e + 1) * out, rows.data());
      float* d = dst + e * in * out;  // (in, out): transformers' layout
      for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) d[i * out + o] = rows[size_t(o * in + i)];
    }
  };
  s.read_quantized = [ar](const std::string& n, int64_t rows, int64_t cols, QuantizedTensor& q) {
    if (!ar->has(n + "_blocks")) return false;
    int64_t experts = 0, out = 0, in = 0;
    q = read_blocks(*ar, n, experts, out, in);
    if (q.rows != rows || q.cols != cols)
      fail(ErrorKind::Shape, ar->path() + ": tensor '" + n + "_blocks'",
           "holds " + std::to_string(experts) + " experts of (" + std::to_string(out) + ", " + std::to_string(in) +
               "), expected " + std::to_string(rows) + " rows of " + std::to_string(cols) + " in all");
    return true;
  };
  return s;
}

}  // namespace qlora
