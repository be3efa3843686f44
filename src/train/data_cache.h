// The prepared-dataset cache: a config's data, prepared once (read, templated, tokenized, masked,
// split, weighted and packed) into one file named by a key over every input that changes it, and
// memory-mapped by later runs, `qlora eval` and `qlora data` instead of being prepared again.
#pragma once
#include <string>

#include "train/train_config.h"

namespace qlora {

struct TokenizerSource;

// The cache folder of a config (dataset_prepared_path; default datasets/ under the user cache),
// or "" when caching is off (dataset_prepared_path: none, or no cache folder can be named).
std::string data_cache_dir(const TrainConfig& cfg);

// What the prepared data of a config is made for: its train files and eval data, or (qlora eval
// with an eval_file) the eval file alone.
enum class DataPurpose { Train, EvalFile };

// 32 hex digits of XXH3-128 over: the pipeline's version, the purpose, the bytes of every data
// file (train files with their format and weight, the eval file), the tokenizer's files (a model
// folder's tokenizer.json, tokenizer_config.json, chat_template.jinja, special_tokens_map.json and
// config.json; a GGUF's metadata), the chat template (and its file's bytes) and every option that
// changes the result (fields, masks, max_length, truncation, bad-row policy, packing, the split,
// the seed where it picks rows or packs, the objective and KTO's batch size).
std::string data_cache_key(const TrainConfig& cfg, const TokenizerSource& ts, DataPurpose purpose);

// Bump when the preparation's output changes for the same inputs (tokenizer, templates, masks, packing).
// 2: a template with {% generation %} blocks places the loss on them; row objects keep their key order.
inline constexpr int kPreparedDataVersion = 2;

}  // namespace qlora
