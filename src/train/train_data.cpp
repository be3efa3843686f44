// Train/eval data for a run.
#include "train/train_data.h"

#include <algorithm>

namespace qlora {

TrainData load_train_data(const TrainConfig& cfg, const ModelSource& src, const std::function<void(const std::string&)>& log) {
  TrainData d;
  DataStats& st = d.stats;
  d.train = load_jsonl_examples(cfg.train_file, src.encoder, cfg.max_length, cfg.truncation, &st);
  log("data: " + std::to_string(st.rows) + " rows, " + std::to_string(st.tokens) + " tokens (" +
      std::to_string(st.trained_tokens) + " trained), longest " + std::to_string(st.longest) + ", truncated " +
      std::to_string(st.truncated) + ", dropped " + std::to_string(st.dropped) + ", no-loss rows skipped " +
      std::to_string(st.skipped_no_loss) + " [tokenizer: " + src.encoder.name + "]");
  d.longest = st.longest;
  if (!cfg.eval_file.empty()) {
    DataStats es;
    d.eval = load_jsonl_examples(cfg.eval_file, src.encoder, cfg.max_length, cfg.truncation, &es);
    d.longest = std::max(d.longest, es.longest);
  } else if (cfg.val_set_size > 0) {
    const int64_t n_eval = cfg.val_set_size < 1
                               ? std::max<int64_t>(1, int64_t(cfg.val_set_size * double(d.train.size())))
                               : int64_t(cfg.val_set_size);
    split_eval(d.train, d.eval, n_eval, uint64_t(cfg.seed));
  }
  d.pad_id = src.encoder.eos >= 0 ? src.encoder.eos : 0;
  return d;
}

}  // namespace qlora
