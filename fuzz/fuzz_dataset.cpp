// Dataset files: JSONL (or a JSON array), every row format, field maps, chat rendering, loss masks,
// truncation policies and pre-tokenized ids. The first input byte picks the options; the rest is
// the file.
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "text/chat_template.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

using namespace qlora;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const Tokenizer tok = Tokenizer::byte_level();
  static const ChatTemplate chatml = ChatTemplate::builtin("chatml");
  const uint8_t opt = data[0];
  static const DatasetFormat formats[] = {DatasetFormat::Auto,     DatasetFormat::Text,
                                          DatasetFormat::Pretokenized, DatasetFormat::Alpaca,
                                          DatasetFormat::ShareGpt, DatasetFormat::Messages,
                                          DatasetFormat::PromptCompletion, DatasetFormat::Segments};
  DatasetSpec spec;
  spec.path = fuzz::write_input(data + 1, size - 1, (opt & 0x80) ? ".json" : ".jsonl");
  spec.format = formats[opt & 7];
  DatasetOptions o;
  o.render = [](const qlora::RowJson& m, bool gen, const qlora::RowJson& extra) {
    return chatml.render(m, gen, extra);
  };
  o.max_length = 48;
  o.truncation = qlora::truncations()[(opt >> 3) & 3];
  o.mask.train_on_inputs = (opt >> 5) & 1;
  o.skip_bad_rows = (opt >> 6) & 1;
  o.vocab_size = tok.vocab_size();
  fuzz::expect_clean_error([&] {
    DatasetStats stats;
    auto examples = load_dataset(spec, &tok, o, &stats);
    for (const auto& ex : examples) {
      if (ex.ids.size() != ex.labels.size() || int64_t(ex.ids.size()) > o.max_length) __builtin_trap();
      render_example(ex, tok, false);
    }
  });
  return 0;
}
