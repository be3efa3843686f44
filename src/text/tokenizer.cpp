// Tokenizer encode/decode: added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor.
#include "text/tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "text/tokenizer_impl.h"
#include "text/unicode.h"

namespace qlora {

// ---- added-token matching ------------------------------------------------------------------

void AddedMatcher::build(const std::vector<std::string>& patterns, const std::vector<size_t>& which) {
  patterns_.clear();
  token_of_.clear();
  by_first_byte_.assign(256, {});
  for (size_t k = 0; k < which.size(); ++k) {
    if (patterns[k].empty()) continue;
    patterns_.push_back(patterns[k]);
    token_of_.push_back(which[k]);
    by_first_byte_[static_cast<unsigned char>(patterns[k][0])].push_back(patterns_.size() - 1);
  }
  for (auto& v : by_first_byte_)
    std::stable_sort(v.begin(), v.end(),
                     [&](size_t a, size_t b) { return patterns_[a].size() > patterns_[b].size(); });
}

bool AddedMatcher::find(std::string_view s, size_t from, size_t& start, size_t& end,
                        size_t& token) const {
  for (size_t i = from; i < s.size(); ++i) {
    for (size_t p : by_first_byte_[static_cast<unsigned char>(s[i])]) {
      const std::string& pat = patterns_[p];
      if (s.compare(i, pat.size(), pat) == 0) {
        start = i;
        end = i + pat.size();
        token = token_of_[p];
        return true;
      }
    }
  }
  return false;
}

static uint32_t last_cp(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i > 0) --i;
  size_t j = i;
  return unicode::next_cp(s, j);
}

void Tokenizer::Impl::split_added(const Piece& p, const AddedMatcher& m,
                                  std::vector<Piece>& out) const {
  const std::string& s = p.text;
  auto emit_text = [&](size_t a, size_t b) {
    if (b <= a) return;
    Piece q;
    q.text = s.substr(a, b - a);
    q.at_origin = p.at_origin && a == 0;
    out.push_back(std::move(q));
  };
  size_t offset = 0, search = 0, ms, me, tok;
  while (!m.empty() && m.find(s, search, ms, me, tok)) {
    search = me;  // the matcher resumes after the raw match, whatever happens to it below
    const AddedToken& t = added[tok];
    size_t start = ms, stop = me;
    if (t.single_word) {
      bool word_before = start > 0 && unicode::is_word_char(last_cp(std::string_view(s).substr(0, start)));
      size_t k = stop;
      bool word_after = stop < s.size() && unicode::is_word_char(unicode::next_cp(s, k));
      if (word_before || word_after) continue;
    }
    if (t.lstrip) {
      size_t ns = start;
      while (ns > 0) {
        size_t k = ns - 1;
        while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t j = k;
        if (!unicode::is_whitespace(unicode::next_cp(s, j))) break;
        ns = k;
      }
      start = std::max(ns, offset);
    }
    if (t.rstrip) {
      size_t k = stop;
      while (k < s.size()) {
        size_t j = k;
        if (!unicode::is_whitespace(unicode::next_cp(s, j))) break;
        k = j;
      }
      stop = k;
    }
    emit_text(offset, start);
    Piece q;
    q.text = s.substr(start, stop - start);
    q.id = t.id;
    out.push_back(std::move(q));
    offset = stop;
  }
  emit_text(offset, s.size());
}

void Tokenizer::Impl::set_added_tokens(std::vector<AddedToken> tokens) {
  added = std::move(tokens);
  added_by_id.clear();
  added_by_content.clear();
  std::vector<std::string> raw_pats, norm_pats;
  std::vector<size_t> raw_idx, norm_idx;
  for (size_t k = 0; k < added.size(); ++k) {
    AddedToken& t = added[k];
    t.decoded = t.content;
    if (t.normalized && normalizer) {
      NormText nt{t.content, true};
      normalizer->normalize(nt);
      t.decoded = nt.text;
    }
    added_by_id[t.id] = k;
    added_by_content[t.content] = t.id;
    if (raw_bytes) continue;  // the byte-level fallback never reads "<s>" in text as BOS
    if (t.normalized) {
      norm_pats.push_back(t.decoded);
      norm_idx.push_back(k);
    } else {
      raw_pats.push_back(t.content);
      raw_idx.push_back(k);
    }
  }
  raw_matcher.build(raw_pats, raw_idx);
  norm_matcher.build(norm_pats, norm_idx);
}

int32_t Tokenizer::Impl::max_id() const {
  int32_t m = bpe ? bpe->max_id() : (raw_bytes ? 255 : -1);
  for (const AddedToken& t : added) m = std::max(m, t.id);
  return m;
}

// ---- encode / decode -----------------------------------------------------------------------

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = im.prefix;
  if (im.raw_bytes) {
    for (unsigned char b : text) ids.push_back(b);
  } else {
    std::string valid;
    if (!unicode::is_valid_utf8(text)) {
      valid = unicode::utf8_lossy(text);
      text = valid;
    }
    // 1. added tokens on the raw text, 2. normalize the rest and match normalized added tokens
    std::vector<Piece> pieces, stage;
    Piece whole;
    whole.text = std::string(text);
    whole.at_origin = true;
    im.split_added(whole, im.raw_matcher, stage);
    for (Piece& p : stage) {
      if (p.id >= 0) {
        pieces.push_back(std::move(p));
        continue;
      }
      if (im.normalizer) {
        NormText nt{std::move(p.text), p.at_origin};
        im.normalizer->normalize(nt);
        p.text = std::move(nt.text);
        p.at_origin = nt.at_origin;
      }
      if (!p.text.empty()) im.split_added(p, im.norm_matcher, pieces);
    }
    // 3. pre-tokenize, 4. the model
    if (im.pre_tokenizer) im.pre_tokenizer->pre_tokenize(pieces);
    for (const Piece& p : pieces) {
      if (p.id >= 0) ids.push_back(p.id);
      else im.bpe->tokenize(p.text, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), im.suffix.begin(), im.suffix.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto it = im.added_by_id.find(id);
    if (it != im.added_by_id.end()) {
      const AddedToken& t = im.added[it->second];
      if (!(skip_special_tokens && t.special)) tokens.push_back(t.decoded);
    } else if (im.raw_bytes) {
      if (id >= 0 && id < 256) tokens.emplace_back(1, static_cast<char>(id));
    } else if (const std::string* s = im.bpe->id_to_token(id)) {
      tokens.push_back(*s);
    }
  }
  if (im.raw_bytes) {
    std::string all;
    for (const std::string& t : tokens) all += t;
    return unicode::utf8_lossy(all);
  }
  if (!im.decoder) {  // HF joins with spaces when there is no decoder
    std::string out;
    for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
    return out;
  }
  im.decoder->decode_chain(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

void Tokenizer::clear_cache() const {
  if (impl_->bpe) impl_->bpe->clear_cache();
}

// ---- lookups -------------------------------------------------------------------------------

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const Impl& im = *impl_;
  auto it = im.added_by_id.find(id);
  if (it != im.added_by_id.end()) return im.added[it->second].decoded;
  if (im.raw_bytes) {
    if (id < 0 || id > 255) return std::nullopt;
    char name[8];
    snprintf(name, sizeof(name), "<0x%02X>", id);
    return std::string(name);
  }
  if (const std::string* s = im.bpe->id_to_token(id)) return *s;
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const Impl& im = *impl_;
  auto it = im.added_by_content.find(token);
  if (it != im.added_by_content.end()) return it->second;
  if (im.raw_bytes) {
    for (int b = 0; b < 256; ++b)
      if (id_to_token(b) == token) return b;
    return std::nullopt;
  }
  int32_t id = im.bpe->token_to_id(token);
  if (id < 0) return std::nullopt;
  return id;
}

int32_t Tokenizer::vocab_size() const { return impl_->max_id() + 1; }

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }
std::optional<int32_t> Tokenizer::unk_id() const { return impl_->unk; }
std::optional<bool> Tokenizer::add_bos_token() const { return impl_->add_bos; }
std::optional<bool> Tokenizer::add_eos_token() const { return impl_->add_eos; }
const std::vector<int32_t>& Tokenizer::special_prefix() const { return impl_->prefix; }
const std::vector<int32_t>& Tokenizer::special_suffix() const { return impl_->suffix; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
bool Tokenizer::clean_up_tokenization_spaces() const { return impl_->clean_up_spaces; }

std::string Tokenizer::clean_up_tokenization(std::string text) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
      {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : kRules) {
    std::string out;
    std::string_view f(from);
    size_t last = 0;
    for (size_t pos = text.find(f); pos != std::string::npos; pos = text.find(f, last)) {
      out.append(text, last, pos - last);
      out += to;
      last = pos + f.size();
    }
    out.append(text, last);
    text = std::move(out);
  }
  return text;
}

// ---- byte-level fallback -------------------------------------------------------------------

Tokenizer Tokenizer::byte_level() {
  auto im = std::make_shared<Impl>();
  im->name = "byte-level";
  im->raw_bytes = true;
  std::vector<AddedToken> specials(2);
  specials[0].id = 256;
  specials[0].content = "<s>";
  specials[1].id = 257;
  specials[1].content = "</s>";
  for (AddedToken& t : specials) t.special = true;
  im->set_added_tokens(std::move(specials));
  im->bos = 256;
  im->eos = 257;
  im->prefix = {256};
  im->add_bos = true;
  im->add_eos = false;
  return Tokenizer(std::move(im));
}

}  // namespace qlora
