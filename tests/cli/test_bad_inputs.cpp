// `qlora train` on malformed inputs, one per reader: every run exits 1 with a message naming the
// offending file and the position (line:column, tensor or key) and what was expected, and writes
// nothing: the output directory stays absent, and a resumed run leaves its checkpoints untouched.
// The catalogue of bad inputs is docs/errors.md.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"

using namespace qlora::cli_test;
namespace fs = std::filesystem;

namespace {

const std::string kSrc = QLORA_SOURCE_DIR;
const std::string kTiny = kSrc + "/tests/fixtures/models/tiny_byte";

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// tiny_byte copied to dir/name, for corrupting.
std::string copy_model(const std::string& dir, const std::string& name) {
  const std::string m = dir + "/" + name;
  fs::create_directories(m);
  for (const auto& e : fs::directory_iterator(kTiny)) fs::copy(e.path(), m + "/" + e.path().filename().string());
  return m;
}

std::string rows(int n, int chars) {
  std::string s;
  for (int i = 0; i < n; i++) s += R"({"text": ")" + std::string(size_t(chars), 'x') + "\"}\n";
  return s;
}

// The tiny example with absolute paths (the test may run from any directory), fast settings.
std::string train_args(const std::string& out, const std::string& extra) {
  return "train " + kSrc + "/examples/tiny.yaml model_name_or_path=" + kTiny + " train_file=" + kSrc +
         "/examples/data/tiny_train.jsonl eval_file=" + kSrc + "/examples/data/tiny_eval.jsonl output_dir=" + out +
         " max_steps=2 save_steps=1 eval_steps=1 logging_steps=1 threads=1 device=cpu " + extra;
}

// Every file under dir with its size and modification time.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> m;
  if (!fs::exists(dir)) return m;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const auto mtime = e.last_write_time().time_since_epoch().count();
    m[fs::relative(e.path(), dir).string()] =
        e.is_regular_file() ? std::to_string(e.file_size()) + " bytes, mtime " + std::to_string(mtime) : "dir";
  }
  return m;
}

struct BadInput {
  std::string name;
  // Builds the bad input under dir; returns the extra arguments (key=value overrides, or a config
  // file in place of tiny.yaml when it starts with "config:") and fills the fragments the message
  // must contain.
  std::function<std::string(const std::string& dir, std::vector<std::string>& expect)> make;
};

const std::vector<BadInput>& fresh_run_cases() {
  static const std::vector<BadInput> cases = {
      {"jsonl_syntax",
       [](const std::string& d, std::vector<std::string>& x) {
         write(d + "/data.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"a\",}\n");
         x = {d + "/data.jsonl:2:14", "malformed JSON", "expected string literal"};
         return "train_file=" + d + "/data.jsonl";
       }},
      {"invalid_utf8_row",
       [](const std::string& d, std::vector<std::string>& x) {
         write(d + "/data.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"bad \xff here\"}\n");
         x = {d + "/data.jsonl:2:", "ill-formed UTF-8 byte"};
         return "train_file=" + d + "/data.jsonl";
       }},
      {"wrong_json_type",
       [](const std::string& d, std::vector<std::string>& x) {
         write(d + "/data.jsonl", "{\"instruction\": \"a\", \"output\": 5}\n");
         x = {d + "/data.jsonl:1", "'output' that is not a string", "format alpaca"};
         return "train_file=" + d + "/data.jsonl";
       }},
      {"missing_field",
       [](const std::string& d, std::vector<std::string>& x) {
         write(d + "/data.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"no answer\"}\n");
         x = {d + "/data.jsonl:2", "has no 'output'"};
         return "train_file=" + d + "/data.jsonl";
       }},
      {"all_rows_too_long",
       [](const std::string& d, std::vector<std::string>& x) {
         write(d + "/data.jsonl", rows(3, 300));
         x = {d + "/data.jsonl", "all 3 rows are longer than max_length 128", "raise max_length to at least 302"};
         return "train_file=" + d + "/data.jsonl truncation=drop";
       }},
      {"truncated_safetensors",
       [](const std::string& d, std::vector<std::string>& x) {
         const std::string m = copy_model(d, "model");
         fs::resize_file(m + "/model.safetensors", 100000);
         x = {m + "/model.safetensors: tensor '", "exceed the file's data section of"};
         return "model_name_or_path=" + m;
       }},
      {"safetensors_header_length_lies",
       [](const std::string& d, std::vector<std::string>& x) {
         const std::string m = copy_model(d, "model");
         std::fstream f(m + "/model.safetensors", std::ios::binary | std::ios::in | std::ios::out);
         f.write("\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
         x = {m + "/model.safetensors: header length 9223372036854775807 exceeds the file size"};
         return "model_name_or_path=" + m;
       }},
      {"shape_disagrees_with_config",
       [](const std::string& d, std::vector<std::string>& x) {
         const std::string m = copy_model(d, "model");
         auto j = nlohmann::json::parse(read_file(m + "/config.json"));
         j["intermediate_size"] = 320;
         write(m + "/config.json", j.dump(2));
         x = {m + "/model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight'", "has shape [344, 128], expected [320, 128]"};
         return "model_name_or_path=" + m;
       }},
      {"config_json_syntax",
       [](const std::string& d, std::vector<std::string>& x) {
         const std::string m = copy_model(d, "model");
         write(m + "/config.json", "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 128,,\n}\n");
         x = {m + "/config.json:3:22", "invalid JSON"};
         return "model_name_or_path=" + m;
       }},
      {"tokenizer_json_syntax",
       [](const std::string& d, std::vector<std::string>& x) {
         const std::string m = copy_model(d, "model");
         write(m + "/tokenizer.json", "{\n \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}\n}");
         x = {m + "/tokenizer.json:2:44", "invalid JSON", "expected string literal"};
         return "model_name_or_path=" + m;
       }},
      {"tokenizer_json_invalid_utf8",
       [](const std::string& d, std::vector<std::string>& x) {
         const std::string m = copy_model(d, "model");
         write(m + "/tokenizer.json", "{\n \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\xff\": 0}}\n}");
         x = {m + "/tokenizer.json:2:", "ill-formed UTF-8 byte"};
         return "model_name_or_path=" + m;
       }},
      {"jinja_syntax_error",
       [](const std::string& d, std::vector<std::string>& x) {
         write(d + "/chat.jsonl", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})" "\n");
         write(d + "/bad.jinja", "hello\n{% for m in messages %}\n{{ m.content + }}\n{% endfor %}\n");
         x = {d + "/bad.jinja:3:16", "unexpected end of print statement"};
         return "train_file=" + d + "/chat.jsonl chat_template=" + d + "/bad.jinja";
       }},
      {"template_raises",
       [](const std::string& d, std::vector<std::string>& x) {
         write(d + "/chat.jsonl", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})" "\n");
         write(d + "/raise.jinja", "{{ raise_exception('Conversation roles must alternate user/assistant') }}");
         x = {d + "/chat.jsonl:1", "the chat template rejected this conversation: Conversation roles must alternate"};
         return "train_file=" + d + "/chat.jsonl chat_template=" + d + "/raise.jinja";
       }},
      {"yaml_unknown_key",
       [](const std::string& d, std::vector<std::string>& x) {
         write(d + "/run.yaml", "model_name_or_path: " + kTiny + "\ntrain_file: " + kSrc +
                                    "/examples/data/tiny_train.jsonl\nlearnig_rate: 1e-3\n");
         x = {d + "/run.yaml:3:1", "unknown key 'learnig_rate'", "did you mean 'learning_rate'?"};
         return "config:" + d + "/run.yaml";
       }},
      {"yaml_wrong_type",
       [](const std::string& d, std::vector<std::string>& x) {
         write(d + "/run.yaml", "model_name_or_path: " + kTiny + "\ntrain_file: " + kSrc +
                                    "/examples/data/tiny_train.jsonl\nmax_steps: ten\n");
         x = {d + "/run.yaml:3:12", "key 'max_steps': 'ten' is not an integer"};
         return "config:" + d + "/run.yaml";
       }},
      {"gguf_truncated",
       [](const std::string& d, std::vector<std::string>& x) {
         fs::copy(kSrc + "/tests/fixtures/gguf/tiny_llama.gguf", d + "/m.gguf");
         fs::resize_file(d + "/m.gguf", 5000);
         x = {d + "/m.gguf: tensor 'output.weight'", "lies outside the 1224-byte data section"};
         return "model_name_or_path=" + d + "/m.gguf";
       }},
      {"gguf_string_length_lies",
       [](const std::string& d, std::vector<std::string>& x) {
         fs::copy(kSrc + "/tests/fixtures/gguf/bad/huge_string.gguf", d + "/m.gguf");
         x = {d + "/m.gguf", "offset 24", "claims 1099511627776 bytes"};
         return "model_name_or_path=" + d + "/m.gguf";
       }},
  };
  return cases;
}

}  // namespace

TEST(BadInputs, TrainStopsNamingFileAndPositionAndWritesNothing) {
  const std::string root = temp_dir("bad_inputs");
  for (const BadInput& c : fresh_run_cases()) {
    SCOPED_TRACE(c.name);
    const std::string d = root + "/" + c.name, out = d + "/out";
    fs::create_directories(d);
    std::vector<std::string> expect;
    const std::string extra = c.make(d, expect);
    std::string args = train_args(out, extra);
    if (extra.rfind("config:", 0) == 0) args = "train " + extra.substr(7) + " output_dir=" + out + " max_steps=2 device=cpu";
    const auto t0 = std::chrono::steady_clock::now();
    RunResult r = run_qlora(args);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "a bad input should fail fast";
    EXPECT_EQ(r.code, 1) << r.output;
    for (const auto& f : expect) EXPECT_NE(r.output.find(f), std::string::npos) << "'" << f << "' not in:\n" << r.output;
    EXPECT_EQ(r.output.find("unexpected error"), std::string::npos) << r.output;  // a qlora::Error, not a stray exception
    EXPECT_TRUE(!fs::exists(out) || fs::is_empty(out)) << "output written for a bad input: " << out;
  }
  fs::remove_all(root);
}

// Resuming from a damaged checkpoint stops before the first step and leaves every file as it was.
TEST(BadInputs, ResumeFromADamagedCheckpointWritesNothing) {
  const std::string root = temp_dir("bad_resume");
  const std::string good = root + "/good";
  RunResult first = run_qlora(train_args(good, "eval_steps=100"));
  ASSERT_EQ(first.code, 0) << first.output;
  ASSERT_TRUE(fs::exists(good + "/checkpoint-1/trainer_state.json")) << first.output;

  struct Case {
    std::string name;
    std::function<void(const std::string& ckpt)> damage;
    std::string extra;
    std::string where;  // after the checkpoint directory
    std::string what;
  } cases[] = {
      {"trainer_state_syntax", [](const std::string& c) { write(c + "/trainer_state.json", "{\"global_step\": 1,\n \"x\": }"); }, "",
       "/trainer_state.json:2:7", "invalid JSON"},
      {"optimizer_truncated", [](const std::string& c) { fs::resize_file(c + "/optimizer.safetensors", 1000); }, "",
       "/optimizer.safetensors: header length", "exceeds the file size of 1000 bytes"},
      {"adapter_rank_mismatch", [](const std::string&) {}, "r=4",
       "/adapter_config.json", "adapter has r=8 and 7 target modules; the model was set up with r=4"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string out = root + "/" + c.name;
    fs::copy(good, out, fs::copy_options::recursive);
    c.damage(out + "/checkpoint-1");
    const auto before = snapshot(out);
    RunResult r = run_qlora(train_args(out, "max_steps=3 resume_from_checkpoint=latest " + c.extra));
    EXPECT_EQ(r.code, 1) << r.output;
    for (const std::string& f : {out + "/checkpoint-1" + c.where, c.what})
      EXPECT_NE(r.output.find(f), std::string::npos) << "'" << f << "' not in:\n" << r.output;
    EXPECT_EQ(snapshot(out), before) << "files changed by a failed resume";
  }
  fs::remove_all(root);
}
