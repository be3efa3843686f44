// One dataset file -> examples: JSONL / JSON-array reading, per-file format detection, bad-row
// policy, truncation and the counts the user sees. Rows are parsed, templated and tokenized in
// parallel (OpenMP, a chunk of rows at a time) and taken in file order, so the examples, counts and
// errors are the same for any thread count.
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "io/json_util.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace qlora {



void DatasetStats::add(const DatasetStats& o) {
  rows += o.rows, examples += o.examples, tokens += o.tokens, trained_tokens += o.trained_tokens;
  longest = std::max(longest, o.longest);
  truncated += o.truncated, dropped += o.dropped, no_loss += o.no_loss, bad_rows += o.bad_rows;
  split_mismatch += o.split_mismatch, double_bos += o.double_bos, eos_added += o.eos_added;
  generation_marked += o.generation_marked;
  for (const auto& m : o.bad_row_messages)
    if (bad_row_messages.size() < 5) bad_row_messages.push_back(m);
  lengths.insert(lengths.end(), o.lengths.begin(), o.lengths.end());
  if (format.find(o.format) == std::string::npos) format += (format.empty() ? "" : ", ") + o.format;
}

namespace {

// "... parse error at line 1, column 7: syntax error ..." -> "syntax error ..."
std::string parse_reason(const json::parse_error& e) {
  std::string w = e.what();
  const size_t c = w.find("column ");
  const size_t colon = c == std::string::npos ? std::string::npos : w.find(": ", c);
  return colon == std::string::npos ? w : w.substr(colon + 2);
}

// Line and column (1-based) of byte offset `byte` (nlohmann counts from 1) in `text`.
std::string line_col(const std::string& text, size_t byte) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i + 1 < byte && i < text.size(); i++) {
    if (text[i] == '\n') line++, col = 1;
    else col++;
  }
  return std::to_string(line) + ":" + std::to_string(col);
}

// A row's JSON value or its parse error, with where it came from.
struct RawRow {
  std::string where;
  std::string text;  // JSONL: the line to parse
  RowJson value;     // JSON array files: already parsed
  bool parsed = false;
};

// What preparing one row gave: its example and encode notes, or the error it raised.
struct Prepared {
  Example ex;
  EncodeInfo info;
  std::optional<Error> error;      // a qlora::Error (Data errors follow the bad-row policy)
  std::exception_ptr other;        // anything else, rethrown as it is
};

constexpr size_t kChunkRows = 4096;  // rows read, then prepared in parallel, at a time

bool starts_with_bracket(std::istream& in) {
  char ch;
  while (in.get(ch))
    if (!std::isspace(static_cast<unsigned char>(ch))) {
      in.unget();
      return ch == '[';
    }
  return false;
}

// One JSON Lines line -> its JSON value; malformed JSON is a Data error at the line.
RowJson parse_json_line(const RawRow& raw) {
  RowJson row;
  try {
    row = RowJson::parse(raw.text);
  } catch (const json::parse_error& e) {
    fail(ErrorKind::Data, raw.where + ":" + std::to_string(e.byte), "malformed JSON: " + parse_reason(e),
         "each line must be one complete JSON object (JSON Lines)");
  } catch (const json::exception& e) {  // out_of_range: a number too large for a double
    fail(ErrorKind::Data, raw.where, "malformed JSON: " + json_error_reason(e),
         "each line must be one complete JSON object (JSON Lines)");
  }
  return row;
}

// A whole .json file's text -> its JSON value; malformed JSON is a Data error at its line and column.
RowJson parse_json_file(const std::string& text, const std::string& path) {
  RowJson arr;
  try {
    arr = RowJson::parse(text);
  } catch (const json::parse_error& e) {
    fail(ErrorKind::Data, path + ":" + line_col(text, e.byte), "malformed JSON: " + parse_reason(e),
         "a .json dataset must be one JSON array of row objects (or use JSON Lines)");
  } catch (const json::exception& e) {
    fail(ErrorKind::Data, path, "malformed JSON: " + json_error_reason(e),
         "a .json dataset must be one JSON array of row objects (or use JSON Lines)");
  }
  return arr;
}

// One dataset file being read: the open stream, the format (once known), the counts and the examples.
struct Loader {
  const std::string& path;
  const Tokenizer* tok;
  const DatasetOptions& opt;
  std::ifstream in;
  DatasetStats st;
  std::vector<Example> out;
  DatasetFormat fmt;
  std::string detected_at;       // where an auto-detected format came from
  int64_t shortest_dropped = 0;  // tokens of the shortest row dropped as too long, and where it is
  std::string shortest_dropped_at;
  const bool limited;
  std::vector<Prepared> prepared;
  std::vector<RawRow> chunk;
  std::error_code size_ec;
  int64_t file_bytes = 0;

  Loader(const DatasetSpec& spec, const Tokenizer* t, const DatasetOptions& o)
      : path(spec.path), tok(t), opt(o), in(path, std::ios::binary), fmt(spec.format), limited(o.limit_rows > 0) {
    if (!in) fail(ErrorKind::Io, path, "cannot open dataset file", "check train_file / datasets paths");
    chunk.reserve(kChunkRows);
    file_bytes = int64_t(std::filesystem::file_size(path, size_ec));
  }

  std::vector<Example> load(DatasetStats* stats_out) {
    if (starts_with_bracket(in)) read_json_array();
    else read_json_lines();
    st.format = fmt == DatasetFormat::Auto ? "unknown" : format_name(fmt);
    if (stats_out) *stats_out = st;
    if (st.examples == 0) fail_unusable();
    return std::move(out);
  }

  void bad(const Error& e) {
    if (!opt.skip_bad_rows) throw e;
    st.bad_rows++;
    if (st.bad_row_messages.size() < 5) st.bad_row_messages.push_back(e.what());
  }

  // Sets fmt from the first row while it is Auto (on one thread), or fails if the row matches none.
  void detect(const RowJson& row, const std::string& where) {
    if (!row.is_object()) fail(ErrorKind::Data, where, "row is not a JSON object", "each row must be one {...} object");
    fmt = detect_format(row, opt.fields);
    if (fmt == DatasetFormat::Auto) {
      std::string keys;
      for (auto it = row.begin(); it != row.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
      fail(ErrorKind::Data, where, "row matches no dataset format (keys: " + (keys.empty() ? "none" : keys) + ")",
           "rows need 'text', 'instruction'+'output' (alpaca), 'conversations' (sharegpt), 'messages', "
           "'prompt'+'completion', 'segments' or 'input_ids'; or set dataset_format / the field_* keys");
    }
    detected_at = where;
  }

  // JSON -> example for one row. Reads fmt and detected_at; sets them only while fmt is Auto, which
  // the caller runs on one thread.
  Example process(const RowJson& row, const std::string& where, EncodeInfo& info) {
    if (fmt == DatasetFormat::Auto) detect(row, where);
    Row r;
    try {
      r = parse_row(row, fmt, opt.fields, opt.mask, where);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::Data || detected_at.empty() || detected_at == where) throw;
      fail(e.kind(), e.where(), e.message() + " [format detected from " + detected_at + "]", e.hint());
    }
    const bool alpaca = fmt == DatasetFormat::Alpaca && opt.alpaca_render;
    Example ex = encode_row(r, tok, opt.mask, alpaca ? opt.alpaca_render : opt.render, where, &info);
    if (opt.vocab_size > 0)
      for (int32_t id : ex.ids)
        if (id < 0 || id >= opt.vocab_size)
          fail(ErrorKind::Data, where, "token id " + std::to_string(id) + " is outside the vocabulary of " +
                                           std::to_string(opt.vocab_size));
    return ex;
  }

  // Counts a row dropped as too long (n tokens), remembering the shortest one.
  void note_dropped(int64_t n, const std::string& where) {
    st.dropped++;
    if (shortest_dropped == 0 || n < shortest_dropped) {
      shortest_dropped = n;
      shortest_dropped_at = where;
    }
  }

  // Applies max_length and the truncation policy to ex; false when the row is dropped.
  bool fit_length(Example& ex, const std::string& where) {
    const int64_t n = int64_t(ex.ids.size());
    if (!ex.roles.empty()) {  // preference rows: max_length bounds each completion with its prompt
      const PrefFit fit = fit_preference(ex, opt.max_length, opt.truncation, where);
      if (fit == PrefFit::Dropped) {
        int64_t longest_doc = 0;
        for (int32_t len : ex.doc_lens) longest_doc = std::max<int64_t>(longest_doc, len);
        note_dropped(longest_doc, where);
        return false;
      }
      st.truncated += fit == PrefFit::Truncated;
    } else if (n > opt.max_length) {
      if (opt.truncation == Truncation::Error)
        fail(ErrorKind::Data, where, "row has " + std::to_string(n) + " tokens, above max_length " +
                                         std::to_string(opt.max_length),
             "raise max_length, or set truncation: drop | truncate_left | truncate_right");
      if (opt.truncation == Truncation::Drop) {
        note_dropped(n, where);
        return false;
      }
      st.truncated++;
      if (opt.truncation == Truncation::TruncateLeft) {
        ex.ids.erase(ex.ids.begin(), ex.ids.end() - opt.max_length);
        ex.labels.erase(ex.labels.begin(), ex.labels.end() - opt.max_length);
      } else {
        ex.ids.resize(size_t(opt.max_length));
        ex.labels.resize(size_t(opt.max_length));
      }
    }
    return true;
  }

  // Fits ex to max_length and, when it has trained tokens, counts it and hands it on.
  void keep(Example ex, const std::string& where) {
    if (!fit_length(ex, where)) return;
    const int64_t tr = ex.n_trained();
    if (tr == 0) {
      st.no_loss++;
      return;
    }
    st.examples++;
    st.tokens += int64_t(ex.ids.size());
    st.trained_tokens += tr;
    st.longest = std::max<int64_t>(st.longest, int64_t(ex.ids.size()));
    st.lengths.push_back(int32_t(ex.ids.size()));
    if (opt.sink) opt.sink(std::move(ex));
    else out.push_back(std::move(ex));
  }

  // Parse and encode one row; safe to run for many rows at once once fmt is known.
  void prepare(const RawRow& raw, Prepared& p) {
    try {
      if (raw.parsed) {
        p.ex = process(raw.value, raw.where, p.info);
      } else {
        RowJson row = parse_json_line(raw);
        p.ex = process(row, raw.where, p.info);
      }
    } catch (const Error& e) {
      p.error = e;
    } catch (...) {
      p.other = std::current_exception();
    }
  }

  // Take a prepared row, in file order: counts, the bad-row policy, truncation.
  void take(Prepared& p, const std::string& where) {
    st.rows++;
    if (p.other) std::rethrow_exception(p.other);
    if (p.error) {
      if (p.error->kind() != ErrorKind::Data) throw *p.error;
      bad(*p.error);
      return;
    }
    st.split_mismatch += p.info.split_mismatch;
    st.double_bos += p.info.double_bos;
    st.eos_added += p.info.eos_added;
    st.generation_marked += p.info.generation_marks;
    keep(std::move(p.ex), where);
  }

  bool done() const { return limited && st.examples >= opt.limit_rows; }

  // A chunk of rows: one at a time until the format is known (detection reads the first good row),
  // the rest in parallel, then taken in order.
  void run_chunk(std::vector<RawRow>& rows) {
    size_t i = 0;
    for (; i < rows.size() && fmt == DatasetFormat::Auto && !done(); i++) {
      Prepared p;
      prepare(rows[i], p);
      take(p, rows[i].where);
    }
    if (i == rows.size() || done()) return;
    prepared.assign(rows.size() - i, Prepared{});
    const int64_t n = int64_t(prepared.size()), first = int64_t(i);
#pragma omp parallel for schedule(dynamic, 16) if (n > 1)
    for (int64_t j = 0; j < n; j++) prepare(rows[size_t(first + j)], prepared[size_t(j)]);
    for (int64_t j = 0; j < n && !done(); j++) take(prepared[size_t(j)], rows[size_t(first + j)].where);
    prepared.clear();
  }

  void report(int64_t bytes_read) {
    if (opt.progress) opt.progress(st.rows, size_ec ? 0 : std::min(bytes_read, file_bytes), size_ec ? 0 : file_bytes);
  }

  // A .json file: one array of row objects, read whole.
  void read_json_array() {
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    RowJson arr = parse_json_file(text, path);
    for (size_t i = 0; i < arr.size() && !done(); i++) {
      chunk.push_back(RawRow{path + ": row " + std::to_string(i + 1), "", std::move(arr[i]), true});
      if (chunk.size() == kChunkRows || i + 1 == arr.size()) {
        run_chunk(chunk);
        chunk.clear();
        report(int64_t(double(file_bytes) * double(i + 1) / double(arr.size())));
      }
    }
  }

  // JSON Lines: one row object per non-blank line.
  void read_json_lines() {
    std::string line;
    int64_t lineno = 0;
    // Previews (limit_rows) read a few rows at a time: they stop as soon as they have enough.
    const size_t per_chunk =
        limited ? std::min<size_t>(kChunkRows, size_t(std::max<int64_t>(opt.limit_rows, 16))) : kChunkRows;
    while (!done() && std::getline(in, line)) {
      lineno++;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      chunk.push_back(RawRow{path + ":" + std::to_string(lineno), std::move(line), {}, false});
      if (chunk.size() == per_chunk) {
        run_chunk(chunk);
        chunk.clear();
        report(int64_t(in.tellg()));
      }
    }
    if (!chunk.empty() && !done()) run_chunk(chunk);
    report(file_bytes);
  }

  // No example survived: say why (empty file, every row too long, or the counts of each cause).
  [[noreturn]] void fail_unusable() const {
    if (st.rows == 0) fail(ErrorKind::Data, path, "dataset is empty", "expected one JSON object per line");
    std::string why = std::to_string(st.rows) + " rows read: " + std::to_string(st.no_loss) +
                      " without a trained token, " + std::to_string(st.dropped) + " dropped as too long, " +
                      std::to_string(st.bad_rows) + " bad";
    if (st.dropped == st.rows)  // every row is longer than max_length: say by how much, and where
      fail(ErrorKind::Data, path,
           "no usable example: all " + std::to_string(st.rows) + " rows are longer than max_length " +
               std::to_string(opt.max_length) + " and truncation is '" + truncation_name(opt.truncation) +
               "' (the shortest, " + std::to_string(shortest_dropped) + " tokens, is " + shortest_dropped_at + ")",
           "raise max_length to at least " + std::to_string(shortest_dropped) +
               ", or set truncation: truncate_right | truncate_left");
    fail(ErrorKind::Data, path, "no usable example (" + why + ")",
         st.no_loss ? "check roles_to_train / train_on_inputs, that rows have responses, and max_length with truncation"
                    : "check the rows and max_length");
  }
};

}  // namespace

std::vector<Example> load_dataset(const DatasetSpec& spec, const Tokenizer* tok, const DatasetOptions& opt,
                                  DatasetStats* stats_out) {
  return Loader(spec, tok, opt).load(stats_out);
}

}  // namespace qlora
