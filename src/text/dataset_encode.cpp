// Row -> ids + labels: plain pieces tokenized one by one; chat turns located by rendering prefixes
// of the conversation, or by the template's {% generation %} marks, so the mask follows the
// template exactly.
#include <algorithm>

#include "core/error.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace qlora {

using json = nlohmann::ordered_json;

int64_t Example::n_trained() const {
  // The label of a document's first token is never a target (nothing precedes it).
  int64_t k = 0;
  size_t start = 0;
  for (size_t d = 0; d < std::max<size_t>(1, doc_lens.size()); d++) {
    const size_t len = doc_lens.empty() ? labels.size() : size_t(doc_lens[d]);
    for (size_t i = start + 1; i < start + len; i++) k += labels[i] != kNoLoss;
    start += len;
  }
  return k;
}

namespace {

// Accumulates ids/labels and the ids a single whole-text tokenization should reproduce.
struct Builder {
  const Tokenizer& tok;
  bool train_all;
  Example ex;
  std::vector<int32_t> text_ids;  // ids that came from text (inserted EOS excluded)
  std::string pending;            // untrained text not yet tokenized

  void push(const std::vector<int32_t>& ids, bool trained, bool from_text = true) {
    for (int32_t id : ids) {
      ex.ids.push_back(id);
      ex.labels.push_back(trained || train_all ? id : kNoLoss);
      if (from_text) text_ids.push_back(id);
    }
  }
  void flush() {
    if (!pending.empty()) push(tok.encode(pending, false), false);
    pending.clear();
  }
  void untrained(const std::string& s) { pending += s; }
  void trained(const std::string& s) {
    flush();
    push(tok.encode(s, false), true);
  }
};

size_t trailing_ws(const std::string& s) {
  size_t n = s.size();
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
  return n;
}

// A trained chat turn's text (content through the template's turn end): loss up to and including
// its last special token; with none, the text minus trailing whitespace gets loss and EOS is
// inserted after it.
void trained_turn(Builder& b, const std::string& s, EncodeInfo& info) {
  b.flush();
  std::vector<int32_t> ids = b.tok.encode(s, false);
  int64_t last = -1;
  for (size_t i = 0; i < ids.size(); i++)
    if (b.tok.is_special(ids[i])) last = int64_t(i);
  if (last >= 0) {
    b.push(std::vector<int32_t>(ids.begin(), ids.begin() + last + 1), true);
    b.push(std::vector<int32_t>(ids.begin() + last + 1, ids.end()), false);
    return;
  }
  const size_t core = trailing_ws(s);
  b.push(b.tok.encode(s.substr(0, core), false), true);
  if (auto eos = b.tok.eos_id()) {
    b.push({*eos}, true, false);
    info.eos_added++;
  }
  b.untrained(s.substr(core));
}

bool is_prefix(const std::string& p, const std::string& full) {
  return p.size() <= full.size() && full.compare(0, p.size(), p) == 0;
}

json first_k(const json& msgs, size_t k) {
  json out = json::array();
  for (size_t i = 0; i < k; i++) out.push_back(msgs[i]);
  return out;
}

ChatTemplate::Rendered render_or_fail(const ChatRenderFn& render, const json& msgs, bool gen, const json& extra,
                                     const std::string& where) {
  try {
    return render(msgs, gen, extra);
  } catch (const Error& e) {
    // A missing or broken template is the run's problem, not this row's.
    if (e.kind() == ErrorKind::Config || e.kind() == ErrorKind::Io || e.kind() == ErrorKind::Unsupported ||
        e.kind() == ErrorKind::Internal)
      throw;
    fail(ErrorKind::Data, where, "the chat template rejected this conversation: " + e.message(),
         e.hint().empty() ? "fix the roles/order of the messages, pick another chat_template, or skip_bad_rows: true"
                          : e.hint());
  }
}

// The row trains exactly its assistant messages (the default roles_to_train, no completion split).
bool trains_assistants(const Row& row) {
  bool any = false;
  for (size_t k = 0; k < row.trained.size(); k++) {
    const bool assistant = row.messages[k].value("role", "") == "assistant";
    if (bool(row.trained[k]) != assistant) return false;
    any = any || assistant;
  }
  return any;
}

// A template that marks the assistant's text with {% generation %}: the loss is on the marked text,
// as transformers' return_assistant_tokens_mask and TRL's assistant_only_loss place it. This holds
// for templates that render earlier turns differently once later ones follow (Qwen3 drops their
// reasoning, gpt-oss ends them with <|end|> instead of <|return|>), where prefixes cannot.
void encode_generation_spans(const ChatTemplate::Rendered& whole, Builder& b, const std::string& where,
                             EncodeInfo& info) {
  const std::string& full = whole.text;
  size_t pos = 0;
  for (const jinja::Span& s : whole.generation) {
    if (s.end > full.size() || s.begin > s.end)
      fail(ErrorKind::Internal, where, "a {% generation %} span lies outside the rendered conversation");
    const size_t lo = std::max(pos, s.begin);  // nested blocks: the outer span already covers the inner
    if (s.end <= lo) continue;
    b.untrained(full.substr(pos, lo - pos));
    b.trained(full.substr(lo, s.end - lo));
    pos = s.end;
  }
  b.untrained(full.substr(pos));
  b.flush();
  info.generation_marks = true;
  if (b.text_ids != b.tok.encode(full, false)) info.split_mismatch = true;
}

void encode_chat(const Row& row, Builder& b, const MaskOptions& mask, const ChatRenderFn& render,
                 const std::string& where, EncodeInfo& info) {
  if (!render)
    fail(ErrorKind::Config, where, "chat rows need a chat template, but the tokenizer has none and chat_template is not set",
         "set chat_template: chatml (or llama3, mistral, alpaca, gemma, or a path to a .jinja file)");
  const json& m = row.messages;
  const size_t n = m.size();
  const ChatTemplate::Rendered whole = render_or_fail(render, m, false, row.extra, where);
  const std::string& full = whole.text;
  bool any = false;
  for (char t : row.trained) any = any || t;
  if (!any) {
    b.untrained(full);
    b.flush();
    return;
  }
  if (whole.marks_generation && trains_assistants(row)) return encode_generation_spans(whole, b, where, info);
  // bound[k] = where message k starts in `full`: the length of the rendering of messages [0, k).
  std::vector<size_t> bound(n + 1, 0);
  bound[n] = full.size();
  for (size_t k = 1; k < n; k++) {
    if (!row.trained[k] && !row.trained[k - 1]) continue;
    const std::string p = render_or_fail(render, first_k(m, k), false, row.extra, where).text;
    if (!is_prefix(p, full))
      fail(ErrorKind::Data, where,
           "the chat template renders messages[0.." + std::to_string(k) +
               ") differently from the start of the whole conversation, so the loss mask cannot be placed",
           "use a chat_template that marks the assistant's text with {% generation %} (examples/chat_templates/ "
           "has Qwen3's and gpt-oss's), one that renders conversations incrementally, train_on_inputs: true, or "
           "skip_bad_rows: true");
    bound[k] = p.size();
  }
  size_t pos = 0;
  for (size_t k = 0; k < n; k++) {
    if (!row.trained[k]) continue;
    const size_t lo = bound[k], hi = bound[k + 1];
    if (lo < pos || hi < lo) fail(ErrorKind::Data, where, "the chat template rendered messages out of order");
    // Loss starts at the content: after the header that add_generation_prompt renders for an
    // assistant turn, else where the content text first appears in the turn.
    size_t c = lo;
    bool found = false;
    if (m[k]["role"] == "assistant") {
      const std::string g = render_or_fail(render, first_k(m, k), true, row.extra, where).text;
      if (is_prefix(g, full) && g.size() >= lo && g.size() <= hi) c = g.size(), found = true;
    }
    const json& content = m[k].contains("content") ? m[k]["content"] : json();
    if (!found && content.is_string() && !content.get_ref<const std::string&>().empty()) {
      const size_t at = full.find(content.get_ref<const std::string&>(), lo);
      if (at != std::string::npos && at + content.get_ref<const std::string&>().size() <= hi) c = at;
    }
    b.untrained(full.substr(pos, c - pos));
    trained_turn(b, full.substr(c, hi - c), info);
    pos = hi;
  }
  b.untrained(full.substr(pos));
  b.flush();
  if (b.text_ids != b.tok.encode(full, false)) info.split_mismatch = true;
}

void encode_plain(const Row& row, Builder& b, EncodeInfo& info) {
  if (row.add_special) b.push(b.tok.special_prefix(), !row.pieces.empty() && row.pieces[0].trained, false);
  std::string whole;
  for (const Row::Piece& p : row.pieces) {
    if (p.trained) b.trained(p.text);
    else b.untrained(p.text);
    whole += p.text;
  }
  b.flush();
  if (row.pieces.size() > 1 && b.text_ids != b.tok.encode(whole, false)) info.split_mismatch = true;
  const auto eos = b.tok.eos_id();
  if (row.append_eos && eos && (b.ex.ids.empty() || b.ex.ids.back() != *eos))
    b.push({*eos}, !row.pieces.empty() && row.pieces.back().trained, false);
}

}  // namespace

Example encode_row(const Row& row, const Tokenizer* tok, const MaskOptions& mask, const ChatRenderFn& render,
                   const std::string& where, EncodeInfo* info) {
  EncodeInfo local;
  EncodeInfo& inf = info ? *info : local;
  inf = EncodeInfo{};
  if (row.kind == Row::Tokens) {
    Example ex;
    ex.ids = row.ids;
    ex.labels = mask.train_on_inputs ? row.ids : row.labels;
    return ex;
  }
  if (!tok)
    fail(ErrorKind::Config, where, "text rows need a tokenizer, but the model has none",
         "add the model's tokenizer.json, or use pre-tokenized rows {\"input_ids\": [...]}");
  if (row.kind == Row::Preference) return encode_preference_row(row, *tok, render, where, mask.prompt_nll);
  Builder b{*tok, mask.train_on_inputs, {}, {}, {}};
  if (row.kind == Row::Chat) encode_chat(row, b, mask, render, where, inf);
  else encode_plain(row, b, inf);
  const auto bos = tok->bos_id();
  inf.double_bos = bos && b.ex.ids.size() >= 2 && b.ex.ids[0] == *bos && b.ex.ids[1] == *bos;
  return std::move(b.ex);
}

std::string render_example(const Example& ex, const Tokenizer& tok, bool ansi) {
  std::string out;
  size_t i = 0;
  while (i < ex.ids.size()) {
    const bool tr = ex.labels[i] != kNoLoss;
    size_t j = i;
    while (j < ex.ids.size() && (ex.labels[j] != kNoLoss) == tr) j++;
    const std::string text = tok.decode(std::vector<int32_t>(ex.ids.begin() + i, ex.ids.begin() + j), false);
    if (!tr) out += text;
    else out += (ansi ? "\x1b[1;32m" : "[[") + text + (ansi ? "\x1b[0m" : "]]");
    i = j;
  }
  return out;
}

}  // namespace qlora
