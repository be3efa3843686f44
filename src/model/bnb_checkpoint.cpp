// Pre-quantized checkpoints (bitsandbytes-4bit and qlora.cpp layouts): reading with checks that
// name the tensor at fault, and writing in the exact form transformers + bitsandbytes load.
#include "model/bnb_checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/mxfp4_experts.h"
#include "quant/bnb4.h"

namespace qlora {

namespace {

constexpr const char* kStateKey = ".quant_state.bitsandbytes__";
constexpr int64_t kNestedBlock = 256;  // bitsandbytes double quant: absmax values per nested block

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool is_bnb4(QuantFormat f) { return f == QuantFormat::NF4 || f == QuantFormat::FP4; }
bool valid_bnb_blocksize(int64_t b) { return b >= 32 && b <= 4096 && (b & (b - 1)) == 0; }

std::string twhere(const SafetensorsArchive& ar, const std::string& name) {
  return ar.path() + ": tensor '" + name + "'";
}

const TensorInfo& need(const SafetensorsArchive& ar, const std::string& name, const std::string& part_of) {
  if (!ar.has(name))
    fail(ErrorKind::Format, twhere(ar, part_of), "missing its part '" + name + "'",
         "the checkpoint is incomplete; re-save or re-quantize it");
  return ar.get(name);
}

// A tensor's elements as T after checking dtype and shape.
template <class T>
void read_exact(const SafetensorsArchive& ar, const std::string& name, const std::string& part_of, DType dt,
                const std::vector<int64_t>& shape, const std::string& why, std::vector<T>& out) {
  const TensorInfo& t = need(ar, name, part_of);
  if (t.dtype != dt)
    fail(ErrorKind::Format, twhere(ar, name),
         std::string("has dtype ") + dtype_traits(t.dtype).safetensors + ", expected " + dtype_traits(dt).safetensors,
         why);
  if (t.shape != shape && !(shape.size() == 1 && t.numel() == shape[0] && t.shape.size() <= 1))
    fail(ErrorKind::Shape, twhere(ar, name), "has shape " + shape_str(t.shape) + ", expected " + shape_str(shape), why);
  out.resize(size_t(t.numel()));
  std::memcpy(out.data(), t.data, size_t(t.nbytes));
}

// --- quant_state JSON: tensor data, so a bad entry is a Format error naming that tensor.
const json& jfield(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    fail(ErrorKind::Format, where, std::string("quant_state has no '") + key + "'",
         "the quant_state JSON is incomplete; re-save the checkpoint with bitsandbytes >= 0.41.3");
  return *it;
}
int64_t jint(const json& j, const char* key, const std::string& where) {
  const json& v = jfield(j, key, where);
  if (!v.is_number_integer())
    fail(ErrorKind::Format, where, std::string("quant_state '") + key + "' is " + v.dump() + ", expected an integer");
  return v.get<int64_t>();
}
std::string jstr(const json& j, const char* key, const std::string& where) {
  const json& v = jfield(j, key, where);
  if (!v.is_string())
    fail(ErrorKind::Format, where, std::string("quant_state '") + key + "' is " + v.dump() + ", expected a string");
  return v.get<std::string>();
}

json quant_state_of(const SafetensorsArchive& ar, const std::string& key) {
  const TensorInfo& t = ar.get(key);
  if (t.dtype != DType::U8)
    fail(ErrorKind::Format, twhere(ar, key), std::string("has dtype ") + dtype_traits(t.dtype).safetensors +
                                                  ", expected U8 (UTF-8 JSON)");
  json j = parse_json(std::string_view(static_cast<const char*>(t.data), size_t(t.nbytes)), twhere(ar, key));
  if (!j.is_object())
    fail(ErrorKind::Format, twhere(ar, key), std::string("holds a JSON ") + json_type_name(j) + ", expected an object");
  return j;
}

int64_t checked_blocksize(int64_t bs, const std::string& where) {
  if (!valid_bnb_blocksize(bs))
    fail(ErrorKind::Unsupported, where, "blocksize " + std::to_string(bs) + " is not supported",
         "bitsandbytes 4-bit blocksizes are powers of two from 32 to 4096 (64 by default)");
  return bs;
}

// The quant_state key of weight `name`, or "" when it has none.
std::string state_key(const SafetensorsArchive& ar, const std::string& name) {
  std::string found;
  for (const char* t : {"nf4", "fp4"}) {
    const std::string k = name + kStateKey + t;
    if (!ar.has(k)) continue;
    if (!found.empty())
      fail(ErrorKind::Format, twhere(ar, name), "has both an nf4 and an fp4 quant_state",
           "a weight is quantized one way; the checkpoint is corrupt");
    found = k;
  }
  return found;
}

QuantizedTensor read_bnb4(const SafetensorsArchive& ar, const CheckpointQuant& cq, const std::string& name,
                          int64_t rows, int64_t cols) {
  const std::string sk = state_key(ar, name);
  if (sk.empty()) {
    for (const auto& n : ar.names())
      if (n.rfind(name + ".quant_state.", 0) == 0)
        fail(ErrorKind::Unsupported, twhere(ar, n), "quant_state type '" + n.substr(name.size() + 13) + "' is not supported",
             "supported bitsandbytes layouts: bitsandbytes__nf4, bitsandbytes__fp4");
    fail(ErrorKind::Format, twhere(ar, name), "is a bitsandbytes 4-bit weight without a quant_state",
         "written by a transformers/bitsandbytes version without 4-bit serialization (bitsandbytes < 0.41.3) or "
         "incomplete; re-save it with current versions, or quantize the original model with `qlora quantize`");
  }
  const std::string sw = twhere(ar, sk);
  const json j = quant_state_of(ar, sk);
  const std::string type = sk.substr(sk.size() - 3);
  const std::string qt = jstr(j, "quant_type", sw);
  if (qt != type)
    fail(ErrorKind::Format, sw, "quant_type '" + qt + "' disagrees with the key suffix '" + type + "'");
  QuantizedTensor q;
  q.params.format = type == "nf4" ? QuantFormat::NF4 : QuantFormat::FP4;
  q.params.blocksize = int(checked_blocksize(jint(j, "blocksize", sw), sw));
  const json& shape = jfield(j, "shape", sw);
  if (shape != json::array({rows, cols}))
    fail(ErrorKind::Shape, sw,
         "quant_state shape " + shape.dump() + " disagrees with the model's " + shape_str({rows, cols}) + " for this weight",
         "config.json and the weights come from different models, or the checkpoint was edited");
  q.params.double_quant = j.contains("nested_offset") || j.contains("nested_blocksize");
  if (q.params.double_quant) {
    const int64_t nbs = jint(j, "nested_blocksize", sw);
    if (nbs != kNestedBlock)
      fail(ErrorKind::Unsupported, sw, "nested_blocksize " + std::to_string(nbs) + " is not supported",
           "bitsandbytes double quantization uses 256");
    const std::string nd = jstr(j, "nested_dtype", sw);
    if (nd != "float32")
      fail(ErrorKind::Unsupported, sw, "nested_dtype '" + nd + "' is not supported", "bitsandbytes writes float32");
    const json& off = jfield(j, "nested_offset", sw);
    if (!off.is_number())
      fail(ErrorKind::Format, sw, "quant_state 'nested_offset' is " + off.dump() + ", expected a number");
    q.offset = float(off.get<double>());
  }
  const QuantParams& want = cq.params;
  if (q.params.format != want.format || q.params.double_quant != want.double_quant ||
      q.params.blocksize != want.blocksize)
    fail(ErrorKind::Format, sw,
         std::string("stores ") + type + (q.params.double_quant ? " with" : " without") + " double quant, blocksize " +
             std::to_string(q.params.blocksize) + ", but the checkpoint's other weights / quantization_config say " +
             quant_format_name(want.format) + (want.double_quant ? " with" : " without") + " double quant, blocksize " +
             std::to_string(want.blocksize),
         "the checkpoint mixes layouts; re-quantize the original model with `qlora quantize`");
  q.rows = rows;
  q.cols = cols;
  const int64_t n = rows * cols, nb = cdiv(n, q.params.blocksize);

  const TensorInfo& w = need(ar, name, name);  // any dtype: bnb_4bit_quant_storage reinterprets the bytes
  if (w.nbytes != (n + 1) / 2)
    fail(ErrorKind::Shape, twhere(ar, name),
         "holds " + std::to_string(w.nbytes) + " bytes, but the quant_state shape " + shape_str({rows, cols}) + " needs " +
             std::to_string((n + 1) / 2),
         "the packed weight and its quant_state disagree; the checkpoint is corrupt");
  q.data.resize(size_t(w.nbytes));
  std::memcpy(q.data.data(), w.data, size_t(w.nbytes));

  const std::string am = name + ".absmax";
  const TensorInfo& a = need(ar, am, name);
  if (a.numel() != nb)
    fail(ErrorKind::Format, twhere(ar, am),
         "has " + std::to_string(a.numel()) + " entries, but blocksize " + std::to_string(q.params.blocksize) + " over " +
             std::to_string(n) + " elements makes " + std::to_string(nb) + " blocks",
         "the quant_state blocksize does not match the stored absmax; the checkpoint is inconsistent");
  const std::string dq_why = q.params.double_quant ? "double quant stores absmax as U8 codes"
                                                   : "without double quant absmax is F32";
  if (q.params.double_quant)
    read_exact(ar, am, name, DType::U8, {nb}, dq_why, q.absmax_q);
  else
    read_exact(ar, am, name, DType::F32, {nb}, dq_why, q.absmax);

  std::vector<float> qmap;
  read_exact(ar, name + ".quant_map", name, DType::F32, {16}, "the 4-bit code table has 16 entries", qmap);
  const float* code = q.params.format == QuantFormat::NF4 ? nf4_code() : fp4_code();
  for (int i = 0; i < 16; i++)
    if (qmap[size_t(i)] != code[i])
      fail(ErrorKind::Unsupported, twhere(ar, name + ".quant_map"),
           "entry " + std::to_string(i) + " is " + std::to_string(qmap[size_t(i)]) + ", bitsandbytes' " + type +
               " table has " + std::to_string(code[i]),
           "only the standard nf4/fp4 code tables are supported (a custom table or an unknown bitsandbytes version)");
  if (q.params.double_quant) {
    read_exact(ar, name + ".nested_absmax", name, DType::F32, {cdiv(nb, kNestedBlock)},
               "one f32 scale per 256 absmax values", q.nested_absmax);
    read_exact(ar, name + ".nested_quant_map", name, DType::F32, {256}, "the 8-bit dynamic map has 256 entries",
               q.nested_code);
  }
  validate_quantized(q);
  return q;
}

std::string suffix_key(const std::string& name, const char* suffix) { return name + suffix; }

QuantizedTensor read_ours(const SafetensorsArchive& ar, const CheckpointQuant& cq, const std::string& name,
                          int64_t rows, int64_t cols) {
  QuantizedTensor q;
  q.params = cq.params;
  q.rows = rows;
  q.cols = cols;
  const char* why = "the layout of `qlora quantize` (see model/bnb_checkpoint.h)";
  switch (q.params.format) {
    case QuantFormat::NVFP4:
      read_exact(ar, name, name, DType::U8, {rows, cdiv(cols, 2)}, why, q.data);
      read_exact(ar, suffix_key(name, "_scale"), name, DType::F8_E4M3, {rows, cdiv(cols, 16)}, why, q.scales);
      read_exact(ar, suffix_key(name, "_scale_2"), name, DType::F32, {1}, why, q.scales_f32);
      break;
    case QuantFormat::MXFP4:
    case QuantFormat::MXFP8_E4M3: {
      const bool fp4 = q.params.format == QuantFormat::MXFP4;
      read_exact(ar, name, name, fp4 ? DType::U8 : DType::F8_E4M3, {rows, fp4 ? cdiv(cols, 2) : cols}, why, q.data);
      read_exact(ar, suffix_key(name, "_scale"), name, DType::U8, {rows, cdiv(cols, 32)}, why, q.scales);
      break;
    }
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: {
      const DType dt = q.params.format == QuantFormat::FP8_E4M3 ? DType::F8_E4M3 : DType::F8_E5M2;
      read_exact(ar, name, name, dt, {rows, cols}, why, q.data);
      const std::vector<int64_t> s = q.params.fp8_scaling == Fp8Scaling::PerTensor    ? std::vector<int64_t>{1}
                                     : q.params.fp8_scaling == Fp8Scaling::Block1x128 ? std::vector<int64_t>{rows, cdiv(cols, 128)}
                                                                                      : std::vector<int64_t>{cdiv(rows, 128), cdiv(cols, 128)};
      read_exact(ar, suffix_key(name, "_scale_inv"), name, DType::F32, s, why, q.scales_f32);
      break;
    }
    case QuantFormat::NF4:
    case QuantFormat::FP4: fail(ErrorKind::Internal, "read_ours", "bnb formats use the bitsandbytes layout");
  }
  validate_quantized(q);
  return q;
}

const char* fp8_scaling_name(Fp8Scaling s) {
  return s == Fp8Scaling::PerTensor ? "per_tensor" : s == Fp8Scaling::Block1x128 ? "1x128" : "128x128";
}

}  // namespace

std::optional<CheckpointQuant> read_checkpoint_quant(const json& config, const SafetensorsArchive& ar,
                                                     const std::string& where) {
  const json* qc = json_find(config, "quantization_config");
  if (!qc) return std::nullopt;
  const std::string w = where + ": quantization_config";
  if (!qc->is_object())
    fail(ErrorKind::Config, where + ": key 'quantization_config'", std::string("is a ") + json_type_name(*qc) + ", expected an object");
  CheckpointQuant cq;
  cq.method = json_string(*qc, "quant_method", w);
  if (cq.method == "mxfp4") {  // gpt-oss: the experts' blocks and scales (model/mxfp4_experts.h)
    cq.params = mxfp4_expert_params();
    return cq;
  }
  if (cq.method == "bitsandbytes") {
    if (json_bool_or(*qc, "load_in_8bit", false, w) || json_bool_or(*qc, "_load_in_8bit", false, w))
      fail(ErrorKind::Unsupported, w + ": key 'load_in_8bit'", "8-bit (LLM.int8) bitsandbytes checkpoints are not supported",
           "use a 4-bit checkpoint (load_in_4bit) or the original model; `qlora quantize --quant nf4` makes one");
    if (!json_bool_or(*qc, "load_in_4bit", false, w) && !json_bool_or(*qc, "_load_in_4bit", false, w))
      fail(ErrorKind::Unsupported, w, "neither load_in_4bit nor load_in_8bit is set", "only 4-bit bitsandbytes checkpoints load");
    const std::string type = json_string_or(*qc, "bnb_4bit_quant_type", "fp4", w);  // transformers' default
    if (type != "nf4" && type != "fp4")
      fail(ErrorKind::Unsupported, w + ": key 'bnb_4bit_quant_type'", "'" + type + "' is not supported", "nf4 or fp4");
    cq.params.format = type == "nf4" ? QuantFormat::NF4 : QuantFormat::FP4;
    cq.params.double_quant = json_bool_or(*qc, "bnb_4bit_use_double_quant", false, w);
    cq.storage = json_string_or(*qc, "bnb_4bit_quant_storage", "uint8", w);
    static const char* kStorage[] = {"uint8", "int8", "float16", "bfloat16", "float32", "float64"};
    if (std::find(std::begin(kStorage), std::end(kStorage), cq.storage) == std::end(kStorage))
      fail(ErrorKind::Unsupported, w + ": key 'bnb_4bit_quant_storage'", "'" + cq.storage + "' is not supported",
           "uint8, int8, float16, bfloat16, float32 or float64");
    cq.compute_dtype = json_string_or(*qc, "bnb_4bit_compute_dtype", "float32", w);
    // config.json has no blocksize: take it from the first quant_state (each weight is checked later).
    for (const auto& n : ar.names()) {
      if (n.find(kStateKey) == std::string::npos) continue;
      const std::string sw = twhere(ar, n);
      cq.params.blocksize = int(checked_blocksize(jint(quant_state_of(ar, n), "blocksize", sw), sw));
      break;
    }
    if (cq.params.blocksize == 0)
      fail(ErrorKind::Format, ar.path(), "config.json says bitsandbytes 4-bit, but no tensor has a quant_state",
           "the weights were not saved by transformers + bitsandbytes >= 0.41.3 (or are missing)");
    return cq;
  }
  if (cq.method == "qlora_cpp") {
    const int64_t version = json_int(*qc, "version", w);
    if (version != 1)
      fail(ErrorKind::Unsupported, w + ": key 'version'", "layout version " + std::to_string(version) + " is not supported",
           "this build reads version 1; use a newer qlora or re-quantize");
    const std::string f = json_string(*qc, "quant_format", w);
    auto fmt = quant_format_from_name(f);
    if (!fmt || is_bnb4(*fmt))
      fail(ErrorKind::Unsupported, w + ": key 'quant_format'", "'" + f + "' is not a qlora_cpp layout format",
           "nvfp4, mxfp4, mxfp8_e4m3, fp8_e4m3 or fp8_e5m2 (nf4/fp4 use the bitsandbytes layout)");
    cq.params.format = *fmt;
    cq.params.blocksize = int(json_int_or(*qc, "blocksize", 0, w));
    const std::string sc = json_string_or(*qc, "fp8_scaling", "per_tensor", w);
    if (sc == "per_tensor") cq.params.fp8_scaling = Fp8Scaling::PerTensor;
    else if (sc == "1x128") cq.params.fp8_scaling = Fp8Scaling::Block1x128;
    else if (sc == "128x128") cq.params.fp8_scaling = Fp8Scaling::Block128x128;
    else fail(ErrorKind::Unsupported, w + ": key 'fp8_scaling'", "'" + sc + "' is not supported", "per_tensor, 1x128 or 128x128");
    const std::string mr = json_string_or(*qc, "mx_scale_rule", "floor", w);
    if (mr != "floor" && mr != "ceil")
      fail(ErrorKind::Unsupported, w + ": key 'mx_scale_rule'", "'" + mr + "' is not supported", "floor or ceil");
    cq.params.mx_scale_rule = mr == "floor" ? MxScaleRule::Floor : MxScaleRule::Ceil;
    cq.params.blocksize = quant_blocksize(cq.params);
    return cq;
  }
  fail(ErrorKind::Unsupported, w + ": key 'quant_method'", "quantization method '" + cq.method + "' is not supported",
       "supported: bitsandbytes 4-bit (nf4/fp4) and qlora_cpp (`qlora quantize` output); or use the unquantized model");
}

bool is_quantized_weight(const SafetensorsArchive& ar, const CheckpointQuant& cq, const std::string& name) {
  if (cq.method == "bitsandbytes") {
    if (ar.has(name + kStateKey + std::string("nf4")) || ar.has(name + kStateKey + std::string("fp4"))) return true;
    // A packed weight that lost its quant_state still counts, so reading it explains what is missing.
    return ar.has(name) && ar.has(name + ".absmax");
  }
  return ar.has(name + "_scale") || ar.has(name + "_scale_inv") || ar.has(name + "_scale_2");
}

QuantizedTensor read_quantized_weight(const SafetensorsArchive& ar, const CheckpointQuant& cq, const std::string& name,
                                      int64_t rows, int64_t cols) {
  return cq.method == "bitsandbytes" ? read_bnb4(ar, cq, name, rows, cols) : read_ours(ar, cq, name, rows, cols);
}

TensorSource quantized_checkpoint_source(std::shared_ptr<const SafetensorsArchive> ar, CheckpointQuant cq,
                                         const std::string& description) {
  TensorSource s;
  s.description = description;
  s.stored_quant = cq.params;
  s.has = [ar](const std::string& n) { return ar->has(n); };
  // Each read copies the weight and its quantization state, then drops their mapped pages.
  s.read_quantized = [ar, cq](const std::string& n, int64_t rows, int64_t cols, QuantizedTensor& q) {
    if (!is_quantized_weight(*ar, cq, n)) return false;
    q = read_quantized_weight(*ar, cq, n, rows, cols);
    ar->release_pages(n);
    return true;
  };
  s.read_f32 = [ar, cq](const std::string& n, const std::vector<int64_t>& shape, float* dst) {
    if (!is_quantized_weight(*ar, cq, n)) {
      ar->read_f32(n, dst, shape);
    } else {
      if (shape.size() != 2)
        fail(ErrorKind::Shape, twhere(*ar, n), "is stored quantized, but a " + shape_str(shape) + " tensor was asked for");
      dequantize_ref(read_quantized_weight(*ar, cq, n, shape[0], shape[1]), dst);
    }
    ar->release_pages(n);
  };
  return s;
}

// ------------------------------------------------------------------------------------------------
// Writing

json quantization_config_json(const QuantParams& p, const std::string& compute_dtype) {
  if (is_bnb4(p.format))  // BitsAndBytesConfig.to_dict() with transformers' defaults for the rest
    return json{{"_load_in_4bit", true},
                {"_load_in_8bit", false},
                {"bnb_4bit_compute_dtype", compute_dtype},
                {"bnb_4bit_quant_storage", "uint8"},
                {"bnb_4bit_quant_type", quant_format_name(p.format)},
                {"bnb_4bit_use_double_quant", p.double_quant},
                {"llm_int8_enable_fp32_cpu_offload", false},
                {"llm_int8_has_fp16_weight", false},
                {"llm_int8_skip_modules", nullptr},
                {"llm_int8_threshold", 6.0},
                {"load_in_4bit", true},
                {"load_in_8bit", false},
                {"quant_method", "bitsandbytes"}};
  return json{{"quant_method", "qlora_cpp"},
              {"version", 1},
              {"quant_format", quant_format_name(p.format)},
              {"blocksize", quant_blocksize(p)},
              {"fp8_scaling", fp8_scaling_name(p.fp8_scaling)},
              {"mx_scale_rule", p.mx_scale_rule == MxScaleRule::Floor ? "floor" : "ceil"},
              {"modules_to_not_convert", json::array({"lm_head", "embed_tokens"})}};
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);  // "-d.ddde-xx"
  std::string s(buf, r.ptr);
  std::string out = s[0] == '-' ? "-" : "";
  if (s[0] == '-') s.erase(0, 1);
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  const int exp10 = std::stoi(s.substr(e + 1));
  const int decpt = exp10 + 1, nd = int(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) return out + "0." + std::string(size_t(-decpt), '0') + digits;
    if (decpt >= nd) return out + digits + std::string(size_t(decpt - nd), '0') + ".0";
    return out + digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
  }
  std::string m = digits.substr(0, 1) + (nd > 1 ? "." + digits.substr(1) : "");
  const int x = decpt - 1;
  std::string xs = std::to_string(std::abs(x));
  if (xs.size() < 2) xs = "0" + xs;
  return out + m + "e" + (x < 0 ? "-" : "+") + xs;
}

std::string bnb_quant_state_json(const QuantizedTensor& q, const std::string& orig_dtype) {
  std::string s = std::string("{\"quant_type\": \"") + quant_format_name(q.params.format) +
                  "\", \"blocksize\": " + std::to_string(q.params.blocksize) + ", \"dtype\": \"" + orig_dtype +
                  "\", \"shape\": [" + std::to_string(q.rows) + ", " + std::to_string(q.cols) + "]";
  if (q.params.double_quant)
    s += ", \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": " +
         python_float_repr(double(q.offset));
  return s + "}";
}

void add_quantized_weight(SafetensorsWriter& w, const std::string& name, const QuantizedTensor& q,
                          const std::string& orig_dtype) {
  validate_quantized(q);
  const int64_t rows = q.rows, cols = q.cols, n = rows * cols;
  switch (q.params.format) {
    case QuantFormat::NF4:
    case QuantFormat::FP4: {
      const int64_t nb = cdiv(n, q.params.blocksize);
      w.add(name, DType::U8, {(n + 1) / 2, 1}, q.data.data());
      if (q.params.double_quant) {
        w.add(name + ".absmax", DType::U8, {nb}, q.absmax_q.data());
        w.add(name + ".nested_absmax", DType::F32, {cdiv(nb, kNestedBlock)}, q.nested_absmax.data());
        w.add(name + ".nested_quant_map", DType::F32, {256}, q.nested_code.data());
      } else {
        w.add(name + ".absmax", DType::F32, {nb}, q.absmax.data());
      }
      w.add(name + ".quant_map", DType::F32, {16}, q.params.format == QuantFormat::NF4 ? nf4_code() : fp4_code());
      const std::string js = bnb_quant_state_json(q, orig_dtype);
      w.add(name + kStateKey + quant_format_name(q.params.format), DType::U8, {int64_t(js.size())}, js.data());
      return;
    }
    case QuantFormat::NVFP4:
      w.add(name, DType::U8, {rows, cdiv(cols, 2)}, q.data.data());
      w.add(name + "_scale", DType::F8_E4M3, {rows, cdiv(cols, 16)}, q.scales.data());
      w.add(name + "_scale_2", DType::F32, {1}, q.scales_f32.data());
      return;
    case QuantFormat::MXFP4:
    case QuantFormat::MXFP8_E4M3: {
      const bool fp4 = q.params.format == QuantFormat::MXFP4;
      w.add(name, fp4 ? DType::U8 : DType::F8_E4M3, {rows, fp4 ? cdiv(cols, 2) : cols}, q.data.data());
      w.add(name + "_scale", DType::U8, {rows, cdiv(cols, 32)}, q.scales.data());
      return;
    }
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: {
      w.add(name, q.params.format == QuantFormat::FP8_E4M3 ? DType::F8_E4M3 : DType::F8_E5M2, {rows, cols}, q.data.data());
      const std::vector<int64_t> s = q.params.fp8_scaling == Fp8Scaling::PerTensor    ? std::vector<int64_t>{1}
                                     : q.params.fp8_scaling == Fp8Scaling::Block1x128 ? std::vector<int64_t>{rows, cdiv(cols, 128)}
                                                                                      : std::vector<int64_t>{cdiv(rows, 128), cdiv(cols, 128)};
      w.add(name + "_scale_inv", DType::F32, s, q.scales_f32.data());
      return;
    }
  }
}

}  // namespace qlora
