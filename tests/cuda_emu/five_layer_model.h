// The engine tests' small model under the harness: the llama_gqa fixture's shape cut to five layers
// (three of the five layer inputs offload; fsdp gathers every layer), random weights
// (random_tensor_source(7)), LoRA r 4 / alpha 8 on all seven projections, micro-batches of 2 x 12
// tokens (small_micro_batches), cross-entropy in chunks of 8.
#pragma once
#include <memory>
#include <vector>

#include "model_test_util.h"
#include "backend/backend.h"
#include "model/decoder_model.h"
#include "tasks/bench_run.h"
#include "train/model_source.h"

namespace qlora::testing_util {

inline constexpr int64_t kFiveLayers = 5;

// po: the method, base, checkpointing and sharding under test; the shapes are set here.
inline std::unique_ptr<DecoderModel> five_layer_model(Backend& be, ModelPlanOptions po, double lora_dropout) {
  LlamaConfig c = open_model_source(std::string(QLORA_FIXTURES) + "/models/llama_gqa").config;
  c.n_layer = kFiveLayers;
  po.quant_blocksize = 64;
  po.micro_batch = 2;
  po.seq_len = 12;
  po.ce_chunk = 8;
  LoraSpec lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.dropout = lora_dropout;
  lora.targets = LoraSpec::resolve_targets({"all-linear"});
  auto m = std::make_unique<DecoderModel>(c, be, po, lora);
  m->load_base(random_tensor_source(7));
  m->init_trainable(1);
  return m;
}

// A device tensor's bytes, copied to the host.
inline std::vector<unsigned char> device_bytes(DecoderModel& m, const Tensor& t) {
  std::vector<unsigned char> v(size_t(t.numel() * dtype_size(t.dtype)));
  m.backend().copy_to_host(v.data(), t.data, v.size());
  return v;
}

}  // namespace qlora::testing_util
