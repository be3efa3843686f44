// Dataset rows -> token examples: format detection, chat rendering, loss masks, truncation, stats.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"

namespace qlora {

class Tokenizer;

constexpr int32_t kNoLoss = -100;  // same value as kIgnoreIndex in model/batch.h (HF's ignore_index)

// What a token is to the objective. SFT rows are trained on their labeled tokens; preference rows
// hold a chosen and a rejected completion of one prompt (DPO, ORPO, SimPO), or one completion
// marked desirable or not and a mismatched completion that only measures the KL term (KTO), each
// document its prompt's tokens (Prompt; ORPO scores the chosen one's) then its completion's.
enum class DocRole : int8_t { Sft = 0, Prompt, Chosen, Rejected, Desirable, Undesirable, KlProbe };

// Tokens of one training row, Hugging Face style: labels[t] is the label of token t (kNoLoss = none).
// A packed row holds several documents back to back; doc_lens says how many tokens each has.
struct Example {
  std::vector<int32_t> ids, labels;  // (T)
  std::vector<int32_t> doc_lens;     // empty = one document
  std::vector<DocRole> roles;        // per token (preference rows); empty = SFT
  // Per document, the reference model's summed log-prob of its completion, when computed before
  // training (precompute_ref_log_probs); empty: computed in each step.
  std::vector<double> ref_logps;
  int64_t n_trained() const;         // tokens that produce loss after the causal shift
};

// Preference: TRL's prompt/chosen/rejected (or chosen/rejected sharing an implicit prompt), text
// or message lists; Unpaired: KTO's prompt/completion/label. Both only for preference objectives.
enum class DatasetFormat { Auto, Text, Pretokenized, Alpaca, ShareGpt, Messages, PromptCompletion, Segments,
                           Preference, Unpaired };
const char* format_name(DatasetFormat f);
// "auto", "text", ... as in the config's dataset_format; Config error naming `where` otherwise.
DatasetFormat parse_format(const std::string& name, const std::string& where);

// truncation: an example longer than max_length is dropped, cut to its end (TruncateLeft) or its
// start (TruncateRight), or stops the load with an error naming the row.
enum class Truncation { Drop, TruncateLeft, TruncateRight, Error };
const char* truncation_name(Truncation t);  // "drop" | "truncate_left" | "truncate_right" | "error"
const std::vector<Truncation>& truncations();

// Where each format keeps its fields; "" = the usual names (messages / conversations, role / from,
// content / value).
struct FieldMap {
  std::string text = "text";
  std::string messages, role, content;
};

// The format of a row by its keys, or Auto when none matches.
// Rows keep their objects' key order, as Python dicts do: templates print tool schemas and tool-call
// arguments with tojson in that order, as transformers renders them.
using RowJson = nlohmann::ordered_json;

DatasetFormat detect_format(const RowJson& row, const FieldMap& fields);

// One row, normalized. Plain rows are text pieces (text, prompt/completion strings, segments);
// chat rows are messages with a per-message "trained" flag; token rows come pre-tokenized.
struct Row {
  enum Kind { Plain, Chat, Tokens, Preference } kind = Plain;
  struct Piece {
    std::string text;
    bool trained = false;
  };
  std::vector<Piece> pieces;  // Plain
  bool add_special = true;    // Plain: put the tokenizer's special prefix (BOS) in front
  bool append_eos = true;     // Plain: end with EOS (trained when the last piece is)
  RowJson messages = RowJson::array();  // Chat: [{role, content, ...}]
  std::vector<char> trained;                           // Chat: per message
  RowJson extra = RowJson::object();     // Chat: template context (tools, ...)
  std::vector<int32_t> ids, labels;                    // Tokens
  // Preference: prompt and completions, all strings or all message lists (the prompt extracted
  // when implicit); Unpaired rows keep their completion in `chosen` and their label in `desirable`.
  RowJson prompt, chosen, rejected;
  bool unpaired = false, desirable = true;
};

// Which messages get loss in chat formats (train_on_inputs aside).
struct MaskOptions {
  bool train_on_inputs = false;                       // every token gets loss
  std::vector<std::string> roles_to_train = {"assistant"};
  bool prompt_nll = false;  // preference rows: the chosen's prompt tokens carry labels too (ORPO's NLL)
};

// A JSON object -> Row in format `fmt`. Data error at `where` naming the format and the fields
// when a required field is missing or has the wrong type.
Row parse_row(const RowJson& obj, DatasetFormat fmt, const FieldMap& fields, const MaskOptions& mask,
              const std::string& where);

// A chat row's template context besides its messages: `tools` (a list, or a JSON string of one) and
// TRL's `chat_template_kwargs` (an object of more variables: enable_thinking, reasoning_effort, ...)
// into r.extra. Data error at `where` for kwargs that are not an object or that name a variable the
// renderer sets (messages, add_generation_prompt, tools, documents).
void read_template_context(const RowJson& obj, Row& r, const std::string& where);

// Renders messages with a chat template (ChatTemplate::render_with_spans: the text, and the spans of
// a template that marks {% generation %}); throws qlora::Error with the template's message when it
// rejects a conversation. A function returning a plain string makes a rendering without marks.
using ChatRenderFn =
    std::function<ChatTemplate::Rendered(const RowJson& messages, bool add_generation_prompt, const RowJson& extra)>;

struct EncodeInfo {
  bool split_mismatch = false;  // segment-wise ids differ from tokenizing the whole text at once
  bool double_bos = false;      // the ids start with BOS twice (template BOS + tokenizer BOS)
  int64_t eos_added = 0;        // EOS tokens inserted after trained turns lacking an end-of-turn token
  bool generation_marks = false;  // the loss follows the template's {% generation %} marks
};

// Row -> ids + labels. Chat rows: each trained turn gets loss from its content (after the role
// header that add_generation_prompt renders) through its last special token (the template's
// end-of-turn, e.g. <|im_end|>); text after that token (the template's "\n") has none. A trained
// turn with no special token gets EOS inserted after its text (minus trailing whitespace).
// `tok` may be null only for Tokens rows.
Example encode_row(const Row& row, const Tokenizer* tok, const MaskOptions& mask, const ChatRenderFn& render,
                   const std::string& where, EncodeInfo* info);

// ---------------------------------------------------------------------------------------------
// Whole files.

struct DatasetSpec {
  std::string path;
  double weight = 1.0;  // copies per epoch; fractions take a seeded subset of rows
  DatasetFormat format = DatasetFormat::Auto;
};

struct DatasetOptions {
  FieldMap fields;
  MaskOptions mask;
  ChatRenderFn render;         // empty: chat rows are an error (no template)
  ChatRenderFn alpaca_render;  // alpaca rows use this when set (the caller's fallback to the alpaca format)
  int64_t max_length = 2048;
  Truncation truncation = Truncation::TruncateRight;
  bool skip_bad_rows = false;
  int64_t vocab_size = 0;      // > 0: pre-tokenized ids must be below it
  int64_t limit_rows = 0;      // > 0: stop after this many examples (previews)
  // Called on the loading thread after each chunk of rows (a few thousand): rows taken so far, and
  // the bytes of the file read so far out of its size.
  std::function<void(int64_t rows, int64_t bytes_read, int64_t bytes_total)> progress;
  // Set: each kept example goes here as it is taken, in file order, and load_dataset returns none
  // (the caller streams them to storage instead of holding the file's examples).
  std::function<void(Example&&)> sink;
};

struct DatasetStats {
  int64_t rows = 0;             // non-empty lines / array entries read
  int64_t examples = 0;         // kept
  int64_t tokens = 0, trained_tokens = 0, longest = 0;
  int64_t truncated = 0, dropped = 0, no_loss = 0, bad_rows = 0;
  int64_t split_mismatch = 0, double_bos = 0, eos_added = 0;
  int64_t generation_marked = 0;              // chat rows whose loss follows {% generation %} marks
  std::vector<std::string> bad_row_messages;  // the first few, for the report
  std::vector<int32_t> lengths;               // tokens per kept example (histogram)
  std::string format;                         // detected or configured (one file)
  void add(const DatasetStats& o);            // sums; lengths appended; formats joined
};

// Reads one JSONL file (or a JSON array file) and encodes every row. Malformed JSON names
// path:line:column; a row that does not fit the file's format names the format and its fields;
// with skip_bad_rows those rows are counted instead. Rows longer than max_length follow the
// truncation policy (counted). Rows without a trained token are skipped and counted; a file where
// every row is like that is an error.
std::vector<Example> load_dataset(const DatasetSpec& spec, const Tokenizer* tok, const DatasetOptions& opt,
                                  DatasetStats* stats);

// ---------------------------------------------------------------------------------------------
// Preference rows (text/preference_rows.cpp), tokenized as TRL's DPOTrainer / KTOTrainer do.

// A JSON object in format Preference or Unpaired -> Row (Data error naming the field at fault: a
// missing or empty completion, a chosen equal to its rejected, mixed strings and message lists).
Row parse_preference_row(const RowJson& obj, DatasetFormat f, const std::string& where);
// Row -> Example: one document per completion, each the prompt's tokens (role Prompt) then the
// completion's (Chosen/Rejected or Desirable/Undesirable), labels on the completion only (with
// prompt_nll also on the chosen's prompt after its first token). Text rows get
// the tokenizer's EOS appended to each completion unless it ends with it, and are tokenized with
// the tokenizer's special tokens; chat rows render the prompt with the generation prompt and the
// prompt followed by the completion without, tokenized as rendered. The completion starts where
// the prompt's tokens and the prompt+completion's tokens first differ.
Example encode_preference_row(const Row& row, const Tokenizer& tok, const ChatRenderFn& render,
                              const std::string& where, bool prompt_nll = false);
// Each document of a preference example to at most max_length tokens: truncate_right keeps the
// start (a prompt that fills max_length drops the row, as TRL's keep_start), truncate_left keeps the
// end, drop drops the row, error fails naming `where`. Returns whether it was cut / dropped.
enum class PrefFit { Kept, Truncated, Dropped };
PrefFit fit_preference(Example& ex, int64_t max_length, Truncation truncation, const std::string& where);
// KTO's KL probes: within each run of batch_size examples (file order), example i gets a second
// document of its own prompt followed by the previous example's completion (the first takes the
// run's last), role KlProbe, cut to max_length as fit_preference cuts. Examples are Desirable or
// Undesirable single documents.
void add_kl_probes(std::vector<Example>& ex, int64_t batch_size, int64_t max_length, Truncation truncation);

// Token run boundaries for previews: [[trained text]] marks (or ANSI colour when `ansi`).
std::string render_example(const Example& ex, const Tokenizer& tok, bool ansi);

}  // namespace qlora
