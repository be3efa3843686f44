// `qlora tokenize --model DIR|FILE.gguf [--text T | --file F] [--json]`: ids and tokens of a text
// with the model's own tokenizer (no weights are read).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "text/tokenizer.h"
#include "train/train_data.h"

namespace qlora {

int cmd_tokenize(int argc, char** argv) {
  CLI::App app{"Tokenize a text with a model's tokenizer and print the ids and tokens.\n"
               "Example: qlora tokenize --model models/SmolLM2 --text \"Hello world\"",
               "qlora tokenize"};
  std::string model, text, file;
  bool as_json = false, no_special = false;
  app.add_option("--model", model, "model directory (tokenizer.json), tokenizer.json file or .gguf file")->required();
  auto* t = app.add_option("--text", text, "the text to tokenize");
  auto* f = app.add_option("--file", file, "read the text from this file (- = stdin)");
  t->excludes(f);
  app.add_flag("--json", as_json, "print {ids, tokens, pieces, count} as JSON");
  app.add_flag("--no-special-tokens", no_special, "do not add the tokenizer's BOS/EOS (add_special_tokens=False)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!file.empty() || t->count() == 0) {
    std::stringstream ss;
    if (file.empty() || file == "-") {
      ss << std::cin.rdbuf();
    } else {
      std::ifstream in(file, std::ios::binary);
      if (!in) fail(ErrorKind::Io, file, "cannot read the text file");
      ss << in.rdbuf();
    }
    text = ss.str();
  }
  const TokenizerSource ts = open_tokenizer_source(model);
  if (!ts.tokenizer)
    fail(ErrorKind::Config, model, "has no tokenizer (" + ts.name + ")", "point --model at a directory with tokenizer.json or a .gguf file");
  const Tokenizer& tok = *ts.tokenizer;
  const std::vector<int32_t> ids = tok.encode(text, !no_special);
  using json = nlohmann::json;
  json tokens = json::array(), pieces = json::array();
  for (int32_t id : ids) {
    tokens.push_back(tok.id_to_token(id).value_or("<unknown>"));
    pieces.push_back(tok.decode({id}, false));
  }
  const auto dump = [](const json& j, int indent = -1) { return j.dump(indent, ' ', false, json::error_handler_t::replace); };
  if (as_json) {
    json j = {{"model", model}, {"tokenizer", ts.name}, {"count", ids.size()}, {"ids", ids}, {"tokens", tokens},
              {"pieces", pieces}};
    std::printf("%s\n", dump(j, 2).c_str());
    return 0;
  }
  std::printf("%zu tokens [%s]\n", ids.size(), ts.name.c_str());
  std::printf("%8s  %-24s %s\n", "id", "token", "text");
  for (size_t i = 0; i < ids.size(); i++)
    std::printf("%8d  %-24s %s\n", ids[i], tokens[i].get<std::string>().c_str(), dump(pieces[i]).c_str());
  std::string all;
  for (size_t i = 0; i < ids.size(); i++) all += (i ? " " : "") + std::to_string(ids[i]);
  std::printf("ids: %s\n", all.c_str());
  return 0;
}

}  // namespace qlora
