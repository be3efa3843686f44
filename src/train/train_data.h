// Everything the trainer (and `qlora data`) needs from the data layer for one run: the config's
// files, template and masking options turned into train/eval examples, packed or not, plus stats.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/comm.h"
#include "text/example_store.h"
#include "text/packing.h"
#include "train/data.h"
#include "train/model_source.h"
#include "train/train_config.h"

namespace qlora {

struct DataFileReport {
  DatasetSpec spec;
  DatasetStats stats;
  int64_t weighted = 0;  // train examples after the eval split and the weight
};

// Where the prepared data came from or went (data_cache.h).
struct DataCacheReport {
  std::string path;    // "" = not cached (dataset_prepared_path: none, or the folder is not writable)
  bool reused = false; // read back instead of prepared
  std::string note;    // why an existing file was not used, or why nothing was cached
  double load_s = 0;   // reused: checking and mapping the file
  int64_t bytes = 0;
  std::string prepared_at;  // UTC time the data was prepared
};

struct TrainData {
  ExampleSet train, eval;            // packed rows when cfg.packing
  DatasetStats stats;                // train files, before weights and packing
  std::vector<DataFileReport> files;
  PackStats pack;                    // rows == 0 when not packing
  int64_t longest = 0;               // longest row (train or eval) as batched
  int32_t pad_id = 0;
  std::string tokenizer_name, template_name;
  double prepare_s = 0, pack_s = 0;  // wall time reading + templating + tokenizing the train files; packing
  double write_s = 0;                // the row plans, index and note written (the records stream as they come)
  int threads = 1;                   // threads that prepared the rows
  DataCacheReport cache;
};

// The tokenizer a model path names, without loading weights: a directory with tokenizer.json
// (or config.json only: the byte-level fallback, as for training), a tokenizer.json file, or GGUF.
struct TokenizerSource {
  std::shared_ptr<const Tokenizer> tokenizer;  // null: pre-tokenized data only
  std::string name;
  int64_t vocab_size = 0;  // ids must be below it (0 = unchecked)
};
TokenizerSource open_tokenizer_source(const std::string& model_name_or_path);

// Train files of a config: train_file, or each dataset_mix entry "PATH [weight=W] [format=F]".
std::vector<DatasetSpec> dataset_specs(const TrainConfig& cfg);

// chat_template -> renderer: "" / tokenizer_default = the tokenizer's template, a built-in name, a
// .jinja path or Jinja text. Empty function when there is none.
ChatRenderFn resolve_chat_template(const std::string& chat_template, const Tokenizer* tok);
// Which template that is, in words, for reports.
std::string chat_template_label(const std::string& chat_template, const Tokenizer* tok);

// Options for load_dataset from the config: fields, masks, max_length/truncation, bad rows, and
// renderers that resolve the chat template at the first chat row (Config error when none exists).
DatasetOptions dataset_options(const TrainConfig& cfg, const TokenizerSource& ts);

// Reads the train files (with weights), eval_file or a val_set_size split, and packs when asked;
// reports what it did through `log`, and progress on a long file (percent, rows/s, ETA) through
// `progress` (null: through `log`). The examples stream into the prepared-data file as they are
// made (data_cache.h), which a later call with the same inputs maps instead of preparing again; a
// damaged, cut or foreign file is prepared again, with a note saying why.
TrainData load_train_data(const TrainConfig& cfg, const TokenizerSource& ts,
                          const std::function<void(const std::string&)>& log,
                          const std::function<void(const std::string&)>& progress = nullptr);
// The same for the ranks of a job: rank 0 prepares (or reuses) the cache while the others wait
// for it (up to the Comm's timeout), then map it; a rank that cannot see the file (no shared
// folder) prepares its own. Without a cache every rank prepares in memory.
TrainData load_train_data(const TrainConfig& cfg, const ModelSource& src,
                          const std::function<void(const std::string&)>& log, Comm* comm = nullptr);

// The eval set of a config exactly as training builds it (same tokenizer, template, masks,
// truncation and packing): eval_file alone, without reading the train files; a val_set_size split
// reads the train files to split them the same way. Config error when the config has neither.
struct EvalData {
  ExampleSet rows;            // packed rows when cfg.packing
  int64_t examples = 0;       // examples before packing
  std::string source;         // the eval file, or "val_set_size split of <train files>"
  int32_t pad_id = 0;
  int64_t longest = 0;
  std::string tokenizer_name, template_name;
  DataCacheReport cache;
};
EvalData load_eval_data(const TrainConfig& cfg, const TokenizerSource& ts,
                        const std::function<void(const std::string&)>& log);

// The first n examples in file order, unpacked (qlora data --show).
std::vector<Example> preview_examples(const TrainConfig& cfg, const TokenizerSource& ts, int64_t n);

}  // namespace qlora
