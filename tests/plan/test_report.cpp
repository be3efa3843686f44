// Reports: the --json fields machines rely on, the text verdicts, and the qlora binary end to end
// (skipped while the binary lacks the plan subcommand).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include "plan/report.h"

using namespace qlora;

namespace {

PlanRequest request(const std::string& model, const std::string& gpu, const std::string& method) {
  PlanRequest r;
  r.model = preset_config(model);
  r.model_label = model;
  r.gpu = resolve_gpu(gpu);
  r.method = parse_method(method, "method");
  return r;
}

// Runs a shell command, returns (exit status, stdout).
std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return {-1, ""};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

bool binary_has_plan() {
  if (!std::filesystem::exists(QLORA_BIN)) return false;
  return run(std::string(QLORA_BIN) + " plan --help 2>&1").second.find("qlora plan") != std::string::npos;
}

}  // namespace

TEST(Report, JsonHasTheDocumentedFields) {
  PlanResult p = make_plan(request("llama3-8b", "h100", "qlora"));
  nlohmann::json j = plan_json(p);
  for (const char* k : {"fits", "total_bytes", "device_bytes", "categories", "step_time_s", "tokens_per_second",
                        "headroom_bytes", "overhead", "flops_per_step", "assumptions", "warnings", "request", "gpu"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["fits"], true);
  EXPECT_EQ(j["total_bytes"].get<int64_t>(), p.total_bytes);
  EXPECT_EQ(j["device_bytes"].get<int64_t>(), int64_t(80) << 30);
  int64_t sum = 0;
  for (const char* c : {"weights", "lora", "grads", "optimizer", "activations", "logits", "workspace", "overhead"}) {
    ASSERT_TRUE(j["categories"].contains(c)) << c;
    sum += j["categories"][c].get<int64_t>();
  }
  EXPECT_EQ(sum, p.total_bytes);  // categories add up to the total
  EXPECT_EQ(j["assumptions"]["measured"], false);
  EXPECT_GT(j["tokens_per_second"].get<double>(), 0);
  EXPECT_FALSE(j.contains("buffers"));
  ReportOptions o;
  o.buffers = true;
  EXPECT_EQ(plan_json(p, o)["buffers"].size(), p.plan.buffers.size());
}

TEST(Report, TextSaysWhyItDoesNotFit) {
  PlanRequest r = request("llama3-70b", "b200", "full");
  PlanResult p = make_plan(r);
  ReportOptions o;
  o.suggestions = suggest_fixes(r);
  const std::string t = plan_text(p, o);
  EXPECT_NE(t.find("fits: NO"), std::string::npos) << t;
  EXPECT_NE(t.find("why: needs"), std::string::npos) << t;
  EXPECT_NE(t.find("what would fit"), std::string::npos) << t;
  EXPECT_NE(t.find("placeholder"), std::string::npos) << t;  // efficiencies named as assumptions
  for (const char* c : {"weights", "lora", "grads", "optimizer", "activations", "logits", "workspace", "overhead"})
    EXPECT_NE(t.find(std::string("\n  ") + c), std::string::npos) << c;
  const std::string q = plan_text(make_plan(request("llama3-70b", "b200", "qlora")));
  EXPECT_NE(q.find("fits: yes"), std::string::npos) << q;
}

TEST(Report, CompareAndFit) {
  std::vector<PlanResult> plans;
  for (const char* g : {"h100", "h200", "b200"}) plans.push_back(make_plan(request("llama3-70b", g, "qlora")));
  const std::string t = compare_text(plans);
  for (const char* g : {"h100-sxm", "h200", "b200"}) EXPECT_NE(t.find(g), std::string::npos) << t;
  EXPECT_EQ(compare_json(plans)["compare"].size(), 3u);
  // H200 and B200 hold 70B QLoRA at 2048 tokens without recompute; the faster device is faster.
  EXPECT_TRUE(plans[1].fits);
  EXPECT_GT(plans[2].speed.tokens_per_second, plans[1].speed.tokens_per_second);
  PlanRequest r = request("llama3-8b", "h100", "qlora");
  FitReport f = fit_search(r);
  nlohmann::json j = fit_json(f);
  EXPECT_EQ(j["max_seq_len"].get<int64_t>(), f.max_seq_len);
  EXPECT_TRUE(j["fastest"].is_object());
  EXPECT_NE(fit_text(f, r).find("longest sequence"), std::string::npos);
}

// The definition of done, through the real binary.
TEST(Report, BinaryEndToEnd) {
  if (!binary_has_plan()) GTEST_SKIP() << QLORA_BIN << " has no plan subcommand yet (main() must dispatch to cmd_plan)";
  const std::string bin = QLORA_BIN;
  auto [rc, out] = run(bin + " plan --model llama3-70b --gpu b200 --method full --json");
  EXPECT_EQ(rc, 3);
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["fits"], false);
  EXPECT_FALSE(j["why"].empty());
  auto [rc2, out2] = run(bin + " plan --model llama3-70b --gpu b200 --method qlora --base-precision nf4 --json");
  EXPECT_EQ(rc2, 0);
  EXPECT_EQ(nlohmann::json::parse(out2)["fits"], true);
  auto [rc3, out3] = run(bin + " plan --model llama3-70b --gpu b2000 2>&1");
  EXPECT_EQ(rc3, 1);
  EXPECT_NE(out3.find("did you mean 'b200'"), std::string::npos) << out3;
  // --attention-dq: the resolved choice in the JSON, the accumulator gone from the buffers, a bad
  // value named.
  const std::string base = bin + " plan --model llama3-8b --gpu h100-sxm --method qlora --seq-len 65536 --checkpointing full";
  auto [rc4, out4] = run(base + " --json");
  auto [rc5, out5] = run(base + " --attention-dq recompute --json");
  ASSERT_EQ(rc4, 0);
  ASSERT_EQ(rc5, 0);
  const nlohmann::json acc = nlohmann::json::parse(out4), rec = nlohmann::json::parse(out5);
  EXPECT_EQ(acc["request"]["attention_dq"], "accumulate");
  EXPECT_EQ(rec["request"]["attention_dq"], "recompute");
  EXPECT_LT(rec["total_bytes"].get<int64_t>(), acc["total_bytes"].get<int64_t>());
  auto [rc6, out6] = run(base + " --attention-dq recompte 2>&1");
  EXPECT_EQ(rc6, 1);
  EXPECT_NE(out6.find("--attention-dq"), std::string::npos) << out6;
}
