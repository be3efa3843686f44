// PEFT adapter and optimizer-state files.
#include "model/peft_io.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_util.h"
#include "io/safetensors.h"

namespace qlora {

static const char kTextModelPrefix[] = ".*language_model.*\\.(";

std::string peft_text_model_targets(const std::vector<std::string>& targets) {
  std::string s = kTextModelPrefix;
  for (size_t i = 0; i < targets.size(); i++) s += (i ? "|" : "") + targets[i];
  return s + ")";
}

std::string peft_adapter_config_json(const LoraSpec& lora, const std::string& base_model, const std::string& multimodal) {
  nlohmann::ordered_json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = base_model;
  j["r"] = lora.r;
  j["lora_alpha"] = lora.alpha;
  j["lora_dropout"] = lora.dropout;
  if (lora.targets.empty()) j["target_modules"] = nullptr;  // LoRA on the experts alone (target_parameters)
  else if (multimodal.empty()) j["target_modules"] = lora.targets;
  else j["target_modules"] = peft_text_model_targets(lora.targets);
  if (!lora.expert_targets.empty()) j["target_parameters"] = peft_target_parameters(lora);
  j["use_rslora"] = lora.use_rslora;
  j["use_dora"] = false;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["modules_to_save"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["rank_pattern"] = nlohmann::ordered_json::object();
  j["alpha_pattern"] = nlohmann::ordered_json::object();
  j["revision"] = nullptr;
  return j.dump(2) + "\n";
}

static std::vector<int64_t> shape_of(const Tensor& t) {
  return std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim);
}

// Copies a device tensor to a host f32 vector.
static std::vector<float> to_host(Backend& be, const Tensor& t) {
  std::vector<float> h(size_t(t.numel()));
  be.copy_to_host(h.data(), t.data, h.size() * 4);
  return h;
}

std::vector<int64_t> peft_shape(const TrainParam& p) {
  if (p.experts == 0) return shape_of(p.w);
  return {p.w.dim(0) / p.experts, p.w.dim(1) * p.experts};
}

// An expert stack's lora_B between the layouts: engine index (e*out + o)*r + j, PEFT's
// po*r*E + j*E + e, po = o, or with interleaved gate/up rows 2o (gate's) and 2(o - out/2) + 1 (up's).
static std::vector<float> convert_expert_b(const TrainParam& p, const std::vector<float>& src, bool to_peft) {
  if (p.experts == 0) return src;
  const int64_t E = p.experts, out = p.w.dim(0) / E, r = p.w.dim(1), half = out / 2;
  std::vector<float> dst(src.size());
  for (int64_t e = 0; e < E; e++)
    for (int64_t o = 0; o < out; o++)
      for (int64_t j = 0; j < r; j++) {
        const int64_t po = !p.interleaved ? o : o < half ? 2 * o : 2 * (o - half) + 1;
        const size_t engine = size_t((e * out + o) * r + j), peft = size_t(po * r * E + j * E + e);
        if (to_peft) dst[peft] = src[engine];
        else dst[engine] = src[peft];
      }
  return dst;
}

std::vector<float> to_peft_layout(const TrainParam& p, const std::vector<float>& engine) {
  return convert_expert_b(p, engine, true);
}
std::vector<float> from_peft_layout(const TrainParam& p, const std::vector<float>& peft) {
  return convert_expert_b(p, peft, false);
}

void write_peft_adapter(const std::string& dir, DecoderModel& model, const std::string& base_model,
                        const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w;
  std::vector<std::vector<float>> keep;
  for (auto& p : model.trainable_params()) {
    keep.push_back(to_peft_layout(p, to_host(model.backend(), p.w)));
    w.add(p.peft_key, DType::F32, peft_shape(p), keep.back().data());
  }
  std::map<std::string, std::string> md = metadata;
  md["format"] = "pt";
  w.set_metadata(md);
  w.write(dir + "/adapter_model.safetensors");
  write_file_atomic(dir + "/adapter_config.json",
                    peft_adapter_config_json(model.lora(), base_model, model.config().multimodal));
}

// The strings of a JSON list under `key`; a non-string element is an error naming its index.
static std::vector<std::string> string_list(const json& list, const std::string& path, const std::string& key,
                                            const char* what) {
  std::vector<std::string> out;
  for (size_t i = 0; i < list.size(); i++) {
    const json& x = list[i];
    if (!x.is_string())
      fail(ErrorKind::Config, path + ": key '" + key + "[" + std::to_string(i) + "]'",
           std::string("expected a ") + what + " string, got " + json_type_name(x) + " " + x.dump());
    out.push_back(x.get<std::string>());
  }
  return out;
}

LoraSpec read_peft_adapter_config(const std::string& path) {
  const json j = read_json_file(path);
  LoraSpec s;
  s.r = json_int(j, "r", path);
  s.alpha = json_number_or(j, "lora_alpha", double(s.r), path);
  s.dropout = json_number_or(j, "lora_dropout", 0.0, path);
  s.use_rslora = json_bool_or(j, "use_rslora", false, path);
  const json* t = json_find(j, "target_modules");
  const json* tp = json_find(j, "target_parameters");
  const bool params = tp && tp->is_array() && !tp->empty();
  const bool none = !t || t->is_null();  // PEFT: target_parameters alone (the stacked experts only)
  if (none && !params)
    fail(ErrorKind::Config, path + ": key 'target_modules'", "missing, and no target_parameters are given");
  std::vector<std::string> names;
  if (none) {
  } else if (t->is_string()) {  // one name ("all-linear"), or the text-model regex of peft_text_model_targets
    const std::string v = t->get<std::string>();
    const std::string pre = kTextModelPrefix;
    if (v.size() > pre.size() + 1 && v.compare(0, pre.size(), pre) == 0 && v.back() == ')') {
      const std::string list = v.substr(pre.size(), v.size() - pre.size() - 1);
      for (size_t a = 0; a <= list.size();) {
        const size_t b = std::min(list.find('|', a), list.size());
        names.push_back(list.substr(a, b - a));
        a = b + 1;
      }
    } else if (v.find_first_of("*()|\\[]^$?+") != std::string::npos) {
      fail(ErrorKind::Unsupported, path + ": key 'target_modules'",
           "the regular expression '" + v + "' is not read; only a list of module names, all-linear, or the "
           "text-model form " + pre + "q_proj|...) are");
    } else {
      names.push_back(v);
    }
  } else if (t->is_array()) {
    names = string_list(*t, path, "target_modules", "module name");
  } else {
    fail(ErrorKind::Config, path + ": key 'target_modules'",
         std::string("expected a list of module names, got ") + json_type_name(*t));
  }
  if (!none) s.targets = LoraSpec::resolve_targets(names);
  if (tp && !tp->is_null()) {
    if (!tp->is_array())
      fail(ErrorKind::Config, path + ": key 'target_parameters'",
           std::string("expected a list of parameter names, got ") + json_type_name(*tp));
    s.expert_targets = LoraSpec::resolve_expert_targets(string_list(*tp, path, "target_parameters", "parameter name"),
                                                        path + ": key 'target_parameters'");
  }
  if (json_bool_or(j, "use_dora", false, path)) fail(ErrorKind::Unsupported, path, "DoRA adapters are not supported");
  return s;
}

void load_peft_adapter(const std::string& dir, DecoderModel& model) {
  const std::string cfg_path = dir + "/adapter_config.json";
  LoraSpec s = read_peft_adapter_config(cfg_path);
  s.targets = lora_targets_for(model.config(), s.targets);  // as the model names them (fused modules)
  const LoraSpec& m = model.lora();
  if (s.expert_targets != m.expert_targets)
    fail(ErrorKind::Config, cfg_path + ": key 'target_parameters'",
         "the adapter adapts " + std::to_string(s.expert_targets.size()) + " expert weight(s); the model was set up with " +
             std::to_string(m.expert_targets.size()),
         "use the adapter's target_parameters");
  if (s.r != m.r || s.targets != m.targets)
    fail(ErrorKind::Config, cfg_path, "adapter has r=" + std::to_string(s.r) + " and " + std::to_string(s.targets.size()) +
                                          " target modules; the model was set up with r=" + std::to_string(m.r) + " and " +
                                          std::to_string(m.targets.size()),
         "use the same r and target_modules as the adapter");
  if (std::fabs(s.alpha - m.alpha) > 1e-9 || s.use_rslora != m.use_rslora)
    fail(ErrorKind::Config, cfg_path, "adapter lora_alpha/use_rslora differ from the configured ones");
  SafetensorsArchive ar(dir + "/adapter_model.safetensors");
  for (auto& p : model.trainable_params()) {
    std::vector<float> h(size_t(p.w.numel()));
    ar.read_f32(p.peft_key, h.data(), peft_shape(p));
    h = from_peft_layout(p, h);
    model.backend().copy_to_device(p.w.data, h.data(), h.size() * 4);
  }
}

void write_optimizer_state(const std::string& path, DecoderModel& model) {
  SafetensorsWriter w;
  std::vector<std::vector<float>> keep;
  for (auto& p : model.trainable_params()) {
    keep.push_back(to_host(model.backend(), p.m));
    w.add(p.peft_key + ".exp_avg", DType::F32, shape_of(p.m), keep.back().data());
    keep.push_back(to_host(model.backend(), p.v));
    w.add(p.peft_key + ".exp_avg_sq", DType::F32, shape_of(p.v), keep.back().data());
  }
  w.write(path);
}

void load_optimizer_state(const std::string& path, DecoderModel& model) {
  SafetensorsArchive ar(path);
  for (auto& p : model.trainable_params()) {
    std::vector<float> h(size_t(p.m.numel()));
    ar.read_f32(p.peft_key + ".exp_avg", h.data(), shape_of(p.m));
    model.backend().copy_to_device(p.m.data, h.data(), h.size() * 4);
    ar.read_f32(p.peft_key + ".exp_avg_sq", h.data(), shape_of(p.v));
    model.backend().copy_to_device(p.v.data, h.data(), h.size() * 4);
  }
}

}  // namespace qlora
