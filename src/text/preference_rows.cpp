// Preference rows: TRL's formats (prompt/chosen/rejected, implicit prompts, KTO's unpaired rows),
// tokenized as trl 1.16's DPOTrainer._prepare_dataset and KTOTrainer._prepare_dataset do, and cut
// to max_length per completion as their collators cut.
#include <algorithm>

#include "core/error.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace qlora {

using json = nlohmann::ordered_json;

namespace {

[[noreturn]] void bad_row(DatasetFormat f, const std::string& where, const std::string& what) {
  fail(ErrorKind::Data, where, "row " + what + " (format " + std::string(format_name(f)) + ")",
       f == DatasetFormat::Unpaired
           ? "rows need 'prompt', 'completion' (both strings or both message lists) and a boolean 'label'"
           : "rows need 'chosen' and 'rejected' (both strings or both message lists) and optionally a 'prompt' "
             "of the same kind; or skip_bad_rows: true");
}

const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// A message list as chat templates take it: objects with string 'role' and 'content'.
void check_messages(const json& v, const char* key, DatasetFormat f, const std::string& where) {
  for (size_t i = 0; i < v.size(); i++) {
    const json& m = v[i];
    const std::string at = std::string(key) + "[" + std::to_string(i) + "]";
    if (!m.is_object()) bad_row(f, where, "has " + at + " that is not a message object");
    if (!m.contains("role") || !m["role"].is_string()) bad_row(f, where, "has " + at + " without a string 'role'");
    if (!m.contains("content")) bad_row(f, where, "has " + at + " without 'content'");
  }
}

bool is_empty_completion(const json& v) {
  if (v.is_string()) return v.get_ref<const std::string&>().empty();
  if (!v.is_array() || v.empty()) return true;
  for (const json& m : v)
    if (m.contains("content") && !(m["content"].is_string() && m["content"].get_ref<const std::string&>().empty()))
      return false;
  return true;
}

// trl.data_utils.extract_prompt: the longest shared start of chosen and rejected (characters of
// strings, whole messages of lists); a string prompt gives its trailing space to the completions.
// Where one is a prefix of the other the loop runs out and the prompt stops one element short.
void extract_prompt(Row& r) {
  const json &c = r.chosen, &j = r.rejected;
  if (c.is_string()) {
    const std::string &a = c.get_ref<const std::string&>(), &b = j.get_ref<const std::string&>();
    const size_t n = std::min(a.size(), b.size());
    size_t idx = 0;
    for (; idx < n; idx++)
      if (a[idx] != b[idx]) {
        if (idx > 0 && a[idx - 1] == ' ') idx--;
        break;
      }
    if (idx == n && n > 0) idx = n - 1;
    r.prompt = a.substr(0, idx);
    r.chosen = a.substr(idx);
    r.rejected = b.substr(idx);
    return;
  }
  const size_t n = std::min(c.size(), j.size());
  size_t idx = 0;
  for (; idx < n; idx++)
    if (c[idx] != j[idx]) break;
  if (idx == n && n > 0) idx = n - 1;
  json p = json::array(), cc = json::array(), rr = json::array();
  for (size_t i = 0; i < c.size(); i++) (i < idx ? p : cc).push_back(c[i]);
  for (size_t i = idx; i < j.size(); i++) rr.push_back(j[i]);
  r.prompt = std::move(p);
  r.chosen = std::move(cc);
  r.rejected = std::move(rr);
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) n++;
  return n;
}

json concat(const json& a, const json& b) {
  json out = a;
  for (const json& m : b) out.push_back(m);
  return out;
}

}  // namespace

Row parse_preference_row(const json& obj, DatasetFormat f, const std::string& where) {
  Row r;
  r.kind = Row::Preference;
  const bool unpaired = f == DatasetFormat::Unpaired;
  r.unpaired = unpaired;
  const json* prompt = field(obj, "prompt");
  const json* first = field(obj, unpaired ? "completion" : "chosen");
  const json* second = unpaired ? nullptr : field(obj, "rejected");
  if (!first) bad_row(f, where, unpaired ? "has no 'completion'" : "has no 'chosen'");
  if (!unpaired && !second) bad_row(f, where, "has no 'rejected'");
  if (unpaired && !prompt) bad_row(f, where, "has no 'prompt'");
  const bool chat = first->is_array();
  auto same_kind = [&](const json* v, const char* key) {
    if (!v) return;
    if (chat ? !v->is_array() : !v->is_string())
      bad_row(f, where, std::string("has '") + key + "' that is not " + (chat ? "a message list" : "a string") +
                            " like '" + (unpaired ? "completion" : "chosen") + "'");
    if (chat) check_messages(*v, key, f, where);
  };
  if (!chat && !first->is_string())
    bad_row(f, where, std::string("has '") + (unpaired ? "completion" : "chosen") + "' that is neither a string nor a message list");
  same_kind(first, unpaired ? "completion" : "chosen");
  same_kind(second, "rejected");
  same_kind(prompt, "prompt");
  r.chosen = *first;
  if (second) r.rejected = *second;
  if (unpaired) {
    const json* label = field(obj, "label");
    if (!label || !label->is_boolean()) bad_row(f, where, "has no boolean 'label' (true: desirable, false: undesirable)");
    r.desirable = label->get<bool>();
    r.prompt = *prompt;
  } else if (prompt) {
    r.prompt = *prompt;
  } else {
    if (r.chosen == r.rejected) bad_row(f, where, "has 'chosen' equal to 'rejected'");
    extract_prompt(r);
  }
  if (is_empty_completion(r.chosen)) bad_row(f, where, unpaired ? "has an empty 'completion'" : "has an empty 'chosen'");
  if (!unpaired && is_empty_completion(r.rejected)) bad_row(f, where, "has an empty 'rejected'");
  if (!unpaired && r.chosen == r.rejected) bad_row(f, where, "has 'chosen' equal to 'rejected': nothing to prefer");
  if (chat) read_template_context(obj, r, where);
  return r;
}

Example encode_preference_row(const Row& row, const Tokenizer& tok, const ChatRenderFn& render, const std::string& where,
                              bool prompt_nll) {
  const bool chat = row.chosen.is_array();
  if (chat && !render)
    fail(ErrorKind::Config, where, "message-list preference rows need a chat template, and none is set",
         "set chat_template (a built-in name, a .jinja file), or use a tokenizer that has one");
  std::string eos_text;
  if (!chat) {
    const auto eos = tok.eos_id();
    if (!eos) fail(ErrorKind::Config, where, "text preference rows end each completion with EOS, and the tokenizer has none",
                   "use message-list rows with a chat template, or a tokenizer with an eos_token");
    eos_text = tok.decode({*eos}, false);
  }
  auto with_eos = [&](const json& c) {
    std::string s = c.get<std::string>();
    if (s.size() < eos_text.size() || s.compare(s.size() - eos_text.size(), eos_text.size(), eos_text) != 0) s += eos_text;
    return s;
  };
  const std::vector<int32_t> prompt_ids =
      chat ? tok.encode(render(row.prompt, true, row.extra).text, false) : tok.encode(row.prompt.get<std::string>(), true);
  auto full = [&](const json& completion) {
    return chat ? tok.encode(render(concat(row.prompt, completion), false, row.extra).text, false)
                : tok.encode(row.prompt.get<std::string>() + with_eos(completion), true);
  };
  std::vector<std::vector<int32_t>> docs = {full(row.chosen)};
  if (!row.unpaired) docs.push_back(full(row.rejected));
  size_t plen = prompt_ids.size();
  for (const auto& d : docs) plen = std::min(plen, common_prefix(prompt_ids, d));
  Example ex;
  const std::vector<DocRole> completion_role =
      row.unpaired ? std::vector<DocRole>{row.desirable ? DocRole::Desirable : DocRole::Undesirable}
                   : std::vector<DocRole>{DocRole::Chosen, DocRole::Rejected};
  for (size_t k = 0; k < docs.size(); k++) {
    const auto& d = docs[k];
    if (d.size() <= plen)
      fail(ErrorKind::Data, where, "row has a completion that adds no token after the prompt",
           "check that the completion is not empty and the chat template renders it");
    const bool nll = prompt_nll && completion_role[k] == DocRole::Chosen;
    for (size_t i = 0; i < d.size(); i++) {
      ex.ids.push_back(d[i]);
      ex.labels.push_back(i > 0 && (i >= plen || nll) ? d[i] : kNoLoss);
      ex.roles.push_back(i < plen ? DocRole::Prompt : completion_role[k]);
    }
    ex.doc_lens.push_back(int32_t(d.size()));
  }
  return ex;
}

namespace {

// One document's tokens.
struct Doc {
  std::vector<int32_t> ids, labels;
  std::vector<DocRole> roles;
  int64_t prompt() const {
    int64_t p = 0;
    while (p < int64_t(roles.size()) && roles[size_t(p)] == DocRole::Prompt) p++;
    return p;
  }
};

std::vector<Doc> split_docs(const Example& ex) {
  std::vector<Doc> docs;
  size_t at = 0;
  for (int32_t len : ex.doc_lens) {
    Doc d;
    d.ids.assign(ex.ids.begin() + std::ptrdiff_t(at), ex.ids.begin() + std::ptrdiff_t(at + size_t(len)));
    d.labels.assign(ex.labels.begin() + std::ptrdiff_t(at), ex.labels.begin() + std::ptrdiff_t(at + size_t(len)));
    d.roles.assign(ex.roles.begin() + std::ptrdiff_t(at), ex.roles.begin() + std::ptrdiff_t(at + size_t(len)));
    docs.push_back(std::move(d));
    at += size_t(len);
  }
  return docs;
}

void append_doc(Example& ex, const Doc& d) {
  ex.ids.insert(ex.ids.end(), d.ids.begin(), d.ids.end());
  ex.labels.insert(ex.labels.end(), d.labels.begin(), d.labels.end());
  ex.roles.insert(ex.roles.end(), d.roles.begin(), d.roles.end());
  ex.doc_lens.push_back(int32_t(d.ids.size()));
}

// A document cut to max_length. Returns false when no completion token is scored any more.
bool fit_document(Doc& d, int64_t max_length, bool keep_end) {
  const int64_t n = int64_t(d.ids.size());
  if (n > max_length) {
    const auto cut = [&](auto& v) {
      if (keep_end) v.erase(v.begin(), v.end() - std::ptrdiff_t(max_length));
      else v.resize(size_t(max_length));
    };
    cut(d.ids);
    cut(d.labels);
    cut(d.roles);
    d.labels[0] = kNoLoss;  // nothing before it scores it
  }
  for (size_t i = 1; i < d.labels.size(); i++)
    if (d.labels[i] != kNoLoss && d.roles[i] != DocRole::Prompt) return true;
  return false;
}

}  // namespace

PrefFit fit_preference(Example& ex, int64_t max_length, Truncation truncation, const std::string& where) {
  bool too_long = false;
  for (int32_t len : ex.doc_lens) too_long = too_long || len > max_length;
  if (!too_long) return PrefFit::Kept;
  if (truncation == Truncation::Error)
    fail(ErrorKind::Data, where, "row has a completion of more than max_length " + std::to_string(max_length) +
                                     " tokens with its prompt",
         "raise max_length, or set truncation: drop | truncate_left | truncate_right");
  if (truncation == Truncation::Drop) return PrefFit::Dropped;
  const bool keep_end = truncation == Truncation::TruncateLeft;
  std::vector<Doc> docs = split_docs(ex);
  // keep_start drops a row whose prompt alone fills max_length: nothing of its completions is left.
  if (!keep_end && docs[0].prompt() >= max_length) return PrefFit::Dropped;
  Example out;
  for (Doc& d : docs) {
    if (!fit_document(d, max_length, keep_end)) return PrefFit::Dropped;
    append_doc(out, d);
  }
  ex = std::move(out);
  return PrefFit::Truncated;
}

void add_kl_probes(std::vector<Example>& ex, int64_t batch_size, int64_t max_length, Truncation truncation) {
  if (batch_size < 1) fail(ErrorKind::Internal, "add_kl_probes", "batch size below 1");
  // Each example's prompt and completion, before any probe is added.
  std::vector<Doc> own;
  for (size_t i = 0; i < ex.size(); i++) {
    if (ex[i].doc_lens.size() != 1)
      fail(ErrorKind::Internal, "add_kl_probes", "example " + std::to_string(i) + " is not one rated completion");
    own.push_back(split_docs(ex[i])[0]);
  }
  for (size_t start = 0; start < ex.size(); start += size_t(batch_size)) {
    const size_t end = std::min(ex.size(), start + size_t(batch_size));
    for (size_t i = start; i < end; i++) {
      const Doc& mine = own[i];
      const Doc& other = own[i == start ? end - 1 : i - 1];
      const size_t p = size_t(mine.prompt()), q = size_t(other.prompt());
      Doc probe;
      probe.ids.assign(mine.ids.begin(), mine.ids.begin() + std::ptrdiff_t(p));
      probe.ids.insert(probe.ids.end(), other.ids.begin() + std::ptrdiff_t(q), other.ids.end());
      probe.labels.assign(probe.ids.size(), kNoLoss);
      probe.roles.assign(p, DocRole::Prompt);
      probe.roles.resize(probe.ids.size(), DocRole::KlProbe);
      for (size_t k = std::max<size_t>(p, 1); k < probe.ids.size(); k++) probe.labels[k] = probe.ids[k];
      // The probe only measures; cut as the rows are (its row survived, so its prompt fits).
      if (!fit_document(probe, max_length, truncation == Truncation::TruncateLeft))
        fail(ErrorKind::Internal, "add_kl_probes", "a KL probe lost every scored token to max_length");
      append_doc(ex[i], probe);
    }
  }
}

}  // namespace qlora
