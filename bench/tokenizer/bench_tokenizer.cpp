// Tokenizer encode throughput, single thread: encodes every corpus line with
// Tokenizer::encode(line, add_special_tokens=false), repeating passes over the corpus until at
// least --min-seconds have passed; --rounds such timed rounds, the best one is reported.
// tools/peers/tokenizer_bench.py times Hugging Face `tokenizers` on the same files with the same
// JSON shape and checks the ids hash; bench/tokenizer_bench.sh runs both and merges them.
//
// Usage: bench_tokenizer --tokenizer DIR|tokenizer.json --corpus FILE [--min-seconds 2]
//                        [--rounds 3] [--name NAME]
// FILE is a JSON array of strings (*.json) or text with one entry per line (empty lines skipped,
// a trailing '\r' kept). Output: one JSON object on stdout.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
volatile uint64_t g_sink;  // keeps the timed encodes observable

std::vector<std::string> load_corpus(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) qlora::fail(qlora::ErrorKind::Io, path, "cannot open the corpus");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  std::vector<std::string> lines;
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_array()) qlora::fail(qlora::ErrorKind::Format, path, "expected a JSON array of strings");
    for (const auto& s : j) lines.push_back(s.get<std::string>());
    return lines;
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    if (nl > start) lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

// FNV-1a style 64-bit hash over all ids, with a separator after each line (the peer computes the
// same): h = (h ^ id) * P per id, h = (h ^ 0xFFFFFFFF) * P per line.
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL, kFnvPrime = 0x100000001b3ULL;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int usage(const char* msg) {
  std::fprintf(stderr,
               "bench_tokenizer: %s\nusage: bench_tokenizer --tokenizer DIR|FILE --corpus FILE "
               "[--min-seconds 2] [--rounds 3] [--name NAME]\n",
               msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok_path, corpus_path, name;
  double min_seconds = 2.0;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::exit(usage((a + " needs a value").c_str()));
      }
      return argv[++i];
    };
    if (a == "--tokenizer") tok_path = value();
    else if (a == "--corpus") corpus_path = value();
    else if (a == "--min-seconds") min_seconds = std::atof(value().c_str());
    else if (a == "--rounds") rounds = std::max(1, std::atoi(value().c_str()));
    else if (a == "--name") name = value();
    else if (a == "-h" || a == "--help") return usage("encode throughput benchmark"), 0;
    else return usage(("unknown argument " + a).c_str());
  }
  if (tok_path.empty() || corpus_path.empty()) return usage("--tokenizer and --corpus are required");

  try {
    auto t_load = Clock::now();
    qlora::Tokenizer tok = qlora::Tokenizer::from_file(tok_path);
    double load_s = seconds_since(t_load);
    std::vector<std::string> lines = load_corpus(corpus_path);
    uint64_t bytes = 0;
    for (const auto& l : lines) bytes += l.size();

    // Warm-up pass (fills the word cache, as HF's own BPE cache fills) + ids hash and count.
    uint64_t hash = kFnvOffset, tokens = 0;
    for (const auto& l : lines) {
      std::vector<int32_t> ids = tok.encode(l, false);
      tokens += ids.size();
      for (int32_t id : ids) hash = (hash ^ static_cast<uint32_t>(id)) * kFnvPrime;
      hash = (hash ^ 0xFFFFFFFFULL) * kFnvPrime;
    }

    // warm: passes back to back (the word cache keeps what earlier passes filled, as when a
    // model tokenizes the same kind of text all day); cold: the cache is emptied before each
    // pass (untimed), i.e. a corpus tokenized once.
    auto measure = [&](bool cold, nlohmann::json& round_list) {
      double best = 0;  // passes per second
      uint64_t sink = 0;
      for (int r = 0; r < rounds; ++r) {
        int passes = 0;
        double el = 0;
        do {
          if (cold) tok.clear_cache();
          auto t0 = Clock::now();
          for (const auto& l : lines) sink += tok.encode(l, false).size();
          el += seconds_since(t0);
          ++passes;
        } while (el < min_seconds);
        double pps = passes / el;
        best = std::max(best, pps);
        round_list.push_back({{"passes", passes},
                              {"seconds", el},
                              {"bytes_per_second", pps * static_cast<double>(bytes)},
                              {"tokens_per_second", pps * static_cast<double>(tokens)}});
      }
      g_sink = sink;
      return best;
    };
    nlohmann::json warm_rounds = nlohmann::json::array(), cold_rounds = nlohmann::json::array();
    double best = measure(false, warm_rounds);
    double best_cold = measure(true, cold_rounds);

    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
    nlohmann::json out = {
        {"name", name.empty() ? tok_path + " @ " + corpus_path : name},
        {"impl", "qlora.cpp Tokenizer::encode"},
        {"tokenizer", tok_path},
        {"corpus", corpus_path},
        {"lines", lines.size()},
        {"bytes", bytes},
        {"tokens", tokens},
        {"ids_hash", hex},
        {"load_seconds", load_s},
        {"metric", "best of rounds"},
        {"bytes_per_second", best * static_cast<double>(bytes)},
        {"tokens_per_second", best * static_cast<double>(tokens)},
        {"rounds", warm_rounds},
        {"cold", {{"bytes_per_second", best_cold * static_cast<double>(bytes)},
                  {"tokens_per_second", best_cold * static_cast<double>(tokens)},
                  {"rounds", cold_rounds}}},
    };
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const qlora::Error& e) {
    std::fprintf(stderr, "bench_tokenizer: %s: %s\n", e.where().c_str(), e.message().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
}
