#include "train/data_cache.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/cache_dir.h"
#include "io/gguf.h"
#include "model/modes.h"
#include "train/train_data.h"

namespace fs = std::filesystem;

namespace qlora {

std::string data_cache_dir(const TrainConfig& cfg) {
  if (cfg.dataset_prepared_path == "none") return "";
  if (!cfg.dataset_prepared_path.empty()) return cfg.dataset_prepared_path;
  const fs::path base = user_cache_dir();
  return base.empty() ? std::string() : (base / "datasets").string();
}

namespace {

class Hasher {
 public:
  Hasher() : st_(XXH3_createState()) { XXH3_128bits_reset(st_); }
  ~Hasher() { XXH3_freeState(st_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void bytes(const void* p, size_t n) { XXH3_128bits_update(st_, p, n); }
  // A length first, so that consecutive fields cannot run into each other.
  void str(const std::string& s) {
    const uint64_t n = s.size();
    bytes(&n, 8);
    bytes(s.data(), s.size());
  }
  // The first `limit` bytes of a file (all when limit < 0), read through a buffer; a missing file
  // is hashed as such (its absence is an input too).
  void file(const std::string& path, int64_t limit = -1) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      str("missing:" + path);
      return;
    }
    std::string buf(size_t(1) << 20, '\0');
    uint64_t total = 0;
    for (;;) {
      size_t want = buf.size();
      if (limit >= 0) want = size_t(std::min<uint64_t>(want, uint64_t(limit) - total));
      if (want == 0) break;
      const ssize_t r = ::read(fd, buf.data(), want);
      if (r < 0) {
        ::close(fd);
        fail(ErrorKind::Io, path, "cannot read it to key the prepared-data cache");
      }
      if (r == 0) break;
      bytes(buf.data(), size_t(r));
      total += uint64_t(r);
    }
    ::close(fd);
    bytes(&total, 8);
  }
  std::string hex() const {
    const XXH128_hash_t h = XXH3_128bits_digest(st_);
    char out[33];
    std::snprintf(out, sizeof out, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
    return out;
  }

 private:
  XXH3_state_t* st_;
};

void hash_tokenizer_files(Hasher& h, const std::string& model) {
  h.str(model.empty() ? "no model" : "model");
  if (fs::is_directory(model)) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                          "config.json"}) {
      const std::string p = model + "/" + f;
      h.str(f);
      if (fs::exists(p)) h.file(p);
      else h.str("absent");
    }
  } else if (model.size() > 5 && model.compare(model.size() - 5, 5, ".gguf") == 0) {
    h.file(model, int64_t(GgufFile(model).data_offset()));  // metadata: the vocabulary, merges and template
  } else if (!model.empty()) {
    h.file(model);
  }
}

}  // namespace

std::string data_cache_key(const TrainConfig& cfg, const TokenizerSource& ts, DataPurpose purpose) {
  Hasher h;
  h.str("qlora prepared data " + std::to_string(kPreparedDataVersion));
  h.str(purpose == DataPurpose::Train ? "train" : "eval_file");
  if (purpose == DataPurpose::Train) {
    for (const DatasetSpec& s : dataset_specs(cfg)) {
      h.str(s.path);  // reports name the files
      h.file(s.path);
      h.str(format_name(s.format));
      h.bytes(&s.weight, sizeof s.weight);
    }
  }
  h.str(cfg.eval_file.empty() ? "no eval file" : "eval file");
  if (!cfg.eval_file.empty()) h.str(cfg.eval_file), h.file(cfg.eval_file);
  hash_tokenizer_files(h, cfg.model_name_or_path);
  h.bytes(&ts.vocab_size, sizeof ts.vocab_size);
  h.str(cfg.chat_template);
  if (std::error_code ec; !cfg.chat_template.empty() && fs::is_regular_file(cfg.chat_template, ec)) h.file(cfg.chat_template);
  const Objective obj = cfg.rl;
  nlohmann::json o = {{"dataset_text_field", cfg.dataset_text_field},
                      {"field_messages", cfg.field_messages},
                      {"message_field_role", cfg.message_field_role},
                      {"message_field_content", cfg.message_field_content},
                      {"train_on_inputs", cfg.train_on_inputs},
                      {"roles_to_train", cfg.roles_to_train},
                      {"skip_bad_rows", cfg.skip_bad_rows},
                      {"truncation", truncation_name(cfg.truncation)},
                      {"max_length", cfg.max_length},
                      {"packing", cfg.packing},
                      {"val_set_size", purpose == DataPurpose::Train ? cfg.val_set_size : 0.0},
                      {"rl", objective_name(obj)}};
  bool seeded = cfg.packing || (purpose == DataPurpose::Train && cfg.val_set_size > 0);
  if (purpose == DataPurpose::Train)
    for (const DatasetSpec& s : dataset_specs(cfg)) seeded = seeded || s.weight != std::floor(s.weight);
  if (seeded) o["seed"] = cfg.seed;
  if (obj == Objective::Kto) o["per_device_train_batch_size"] = cfg.per_device_train_batch_size;
  h.str(o.dump());
  return h.hex();
}

}  // namespace qlora
