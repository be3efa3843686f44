// Sample answers: prompt encoding, stop ids, greedy generation and the printed / JSON forms.
#include "train/sample_answers.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "model/generate.h"
#include "text/unicode.h"

namespace qlora {

std::vector<int32_t> generation_stop_ids(const Tokenizer& tok, const LlamaConfig& cfg) {
  std::vector<int32_t> ids;
  auto add = [&](int64_t id) {
    if (id >= 0 && id < cfg.vocab_size && std::find(ids.begin(), ids.end(), int32_t(id)) == ids.end())
      ids.push_back(int32_t(id));
  };
  if (auto e = tok.eos_id()) add(*e);
  add(cfg.eos_token_id);
  // End-of-turn / end-of-text tokens of the chat formats we train (ChatML, Llama 3, Phi, Gemma, Mistral).
  for (const char* t : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>",
                        "<end_of_turn>", "</s>"})
    if (auto id = tok.token_to_id(t)) add(*id);
  return ids;
}

std::vector<int32_t> encode_prompt(const std::string& prompt, const ChatRenderFn& render, const Tokenizer& tok) {
  if (render) {
    const RowJson msgs = RowJson::array({{{"role", "user"}, {"content", prompt}}});
    return tok.encode(render(msgs, true, RowJson::object()).text, false);
  }
  std::vector<int32_t> ids = tok.special_prefix();
  const std::vector<int32_t> text = tok.encode(prompt, false);
  ids.insert(ids.end(), text.begin(), text.end());
  return ids;
}

std::vector<SampleAnswer> sample_answers(DecoderModel& model, const Tokenizer& tok, const ChatRenderFn& render,
                                         const std::vector<std::string>& prompts, int64_t max_new_tokens) {
  if (prompts.empty()) return {};
  Generator gen(model);
  return sample_answers(gen, tok, render, prompts, max_new_tokens);
}

std::vector<SampleAnswer> sample_answers(Generator& gen, const Tokenizer& tok, const ChatRenderFn& render,
                                         const std::vector<std::string>& prompts, int64_t max_new_tokens) {
  std::vector<SampleAnswer> out;
  const std::vector<int32_t> stop = generation_stop_ids(tok, gen.config());
  for (const std::string& p : prompts) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = encode_prompt(p, render, tok);
    const std::vector<int32_t> gen_ids = gen.greedy(ids, max_new_tokens, stop);
    SampleAnswer a;
    a.prompt = p;
    a.answer = unicode::utf8_lossy(tok.decode(gen_ids, /*skip_special_tokens=*/true));
    a.prompt_tokens = int64_t(ids.size());
    a.new_tokens = int64_t(gen_ids.size());
    a.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.push_back(std::move(a));
  }
  return out;
}

// `label` then the text, every further line indented to the text's column.
static std::string indented(const std::string& label, const std::string& text) {
  std::string s = label;
  for (char c : text) {
    s += c;
    if (c == '\n') s += std::string(label.size(), ' ');
  }
  return s + "\n";
}

std::string format_sample_answers(const std::vector<SampleAnswer>& answers) {
  std::string s;
  for (const SampleAnswer& a : answers) s += indented("  prompt: ", a.prompt) + indented("  answer: ", a.answer);
  return s;
}

std::string sample_answers_speed(const std::vector<SampleAnswer>& answers) {
  int64_t toks = 0;
  double secs = 0;
  for (const SampleAnswer& a : answers) toks += a.new_tokens, secs += a.seconds;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%zu prompts, %lld new tokens in %.2f s (%.1f tokens/s)", answers.size(),
                (long long)toks, secs, secs > 0 ? double(toks) / secs : 0.0);
  return buf;
}

nlohmann::ordered_json sample_answers_json(const std::vector<SampleAnswer>& answers) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const SampleAnswer& a : answers) j.push_back({{"prompt", a.prompt}, {"answer", a.answer}});
  return j;
}

}  // namespace qlora
