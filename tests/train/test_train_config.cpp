// TrainConfig: defaults, aliases with notes, errors with locations, overrides, cross-field rules, round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "train/engine_config.h"
#include "train/train_config.h"

using namespace qlora;

namespace {

std::string write_yaml(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "qlora_cfg_" + name + ".yaml";
  std::ofstream(path) << text;
  return path;
}

TrainConfig parse(const std::string& text, std::vector<std::string>* notes = nullptr,
                  const std::vector<std::string>& overrides = {}) {
  return parse_train_config(text, "cfg.yaml", overrides, notes);
}

// Runs f, expects a qlora::Error of `kind`, returns it for further checks.
template <class F>
Error expect_error(F f, ErrorKind kind) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e;
  }
  ADD_FAILURE() << "no error thrown";
  return Error(ErrorKind::Internal, "", "");
}

bool has_note(const std::vector<std::string>& notes, const std::string& note) {
  return std::find(notes.begin(), notes.end(), note) != notes.end();
}

const std::vector<std::string> kAll = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

}  // namespace

TEST(TrainConfig, DefaultsAreTheDocumentedOnes) {
  TrainConfig c = parse("");
  EXPECT_EQ(c.output_dir, "out");
  EXPECT_EQ(c.per_device_train_batch_size, 1);
  EXPECT_EQ(c.per_device_eval_batch_size, 1);  // follows the train batch size
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_DOUBLE_EQ(c.learning_rate, 2e-4);
  EXPECT_EQ(c.lr_scheduler_type, LrScheduler::Cosine);
  EXPECT_EQ(c.max_steps, -1);
  EXPECT_DOUBLE_EQ(c.num_train_epochs, 1.0);
  EXPECT_EQ(c.max_length, 2048);
  EXPECT_DOUBLE_EQ(c.adam_beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.adam_epsilon, 1e-8);
  EXPECT_DOUBLE_EQ(c.max_grad_norm, 1.0);
  EXPECT_EQ(c.seed, 42);
  EXPECT_EQ(c.r, 16);
  EXPECT_DOUBLE_EQ(c.lora_alpha, 32);
  EXPECT_DOUBLE_EQ(c.lora_dropout, 0.05);
  EXPECT_EQ(c.target_modules, kAll);  // all-linear
  EXPECT_EQ(c.gradient_checkpointing, Checkpointing::None);
  EXPECT_EQ(c.ce_chunk_size, 1024);
  EXPECT_FALSE(c.base_precision.has_value());
  EXPECT_EQ(c.quant_blocksize, 64);
  EXPECT_EQ(c.truncation, Truncation::TruncateRight);
  EXPECT_EQ(c.dataset_format, DatasetFormat::Auto);
  EXPECT_EQ(c.device, DeviceChoice::Auto);
  EXPECT_FALSE(c.load_in_4bit);
  EXPECT_FALSE(c.packing);
  // The constructor uses the same table and derivations.
  EXPECT_TRUE(TrainConfig() == c);
  TrainConfig d;
  d.load_in_4bit = true;
  d.per_device_eval_batch_size = 0;
  d.per_device_train_batch_size = 3;
  d.target_modules = {"v_proj", "q_proj"};
  finalize_train_config(d);
  EXPECT_EQ(d.base_precision, BasePrecision::Nf4);
  EXPECT_EQ(d.per_device_eval_batch_size, 3);
  EXPECT_EQ(d.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  d.base_precision = BasePrecision::Bf16;
  EXPECT_THROW(finalize_train_config(d), Error);
  EXPECT_EQ(parse("per_device_train_batch_size: 4").per_device_eval_batch_size, 4);
}

TEST(TrainConfig, CanonicalKeysFromFile) {
  std::vector<std::string> notes;
  TrainConfig c = parse(
      "model_name_or_path: models/smollm2\n"
      "learning_rate: 1e-4\n"
      "lr_scheduler_type: linear\n"
      "target_modules: [q_proj, v_proj]\n"
      "packing: true\n"
      "gradient_checkpointing: offload\n"
      "eval_file: ~\n",
      &notes);
  EXPECT_EQ(c.model_name_or_path, "models/smollm2");
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-4);
  EXPECT_EQ(c.lr_scheduler_type, LrScheduler::Linear);
  EXPECT_EQ(c.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_TRUE(c.packing);
  EXPECT_EQ(c.gradient_checkpointing, Checkpointing::Offload);
  EXPECT_EQ(c.eval_file, "");
  EXPECT_TRUE(notes.empty()) << notes.front();
}

struct AliasCase {
  std::string yaml, note;
  std::function<bool(const TrainConfig&)> check;
};

TEST(TrainConfig, EveryAliasNormalizesWithANote) {
  const std::vector<AliasCase> cases = {
      {"base_model: m", "base_model -> model_name_or_path", [](auto& c) { return c.model_name_or_path == "m"; }},
      {"micro_batch_size: 3", "micro_batch_size -> per_device_train_batch_size",
       [](auto& c) { return c.per_device_train_batch_size == 3; }},
      {"batch_size: 5", "batch_size -> per_device_train_batch_size",
       [](auto& c) { return c.per_device_train_batch_size == 5; }},
      {"num_epochs: 3", "num_epochs -> num_train_epochs", [](auto& c) { return c.num_train_epochs == 3; }},
      {"epochs: 2.5", "epochs -> num_train_epochs", [](auto& c) { return c.num_train_epochs == 2.5; }},
      {"lr: 3e-5", "lr -> learning_rate", [](auto& c) { return c.learning_rate == 3e-5; }},
      {"lr_scheduler: linear", "lr_scheduler -> lr_scheduler_type",
       [](auto& c) { return c.lr_scheduler_type == LrScheduler::Linear; }},
      {"sequence_len: 512", "sequence_len -> max_length", [](auto& c) { return c.max_length == 512; }},
      {"cutoff_len: 513", "cutoff_len -> max_length", [](auto& c) { return c.max_length == 513; }},
      {"max_seq_length: 514", "max_seq_length -> max_length", [](auto& c) { return c.max_length == 514; }},
      {"max_seq_len: 515", "max_seq_len -> max_length", [](auto& c) { return c.max_length == 515; }},
      {"lora_r: 8", "lora_r -> r", [](auto& c) { return c.r == 8; }},
      {"moe_aux_loss_coef: 0.01", "moe_aux_loss_coef -> router_aux_loss_coef",
       [](auto& c) { return c.router_aux_loss_coef == "0.01"; }},
      {"lora_rank: 4", "lora_rank -> r", [](auto& c) { return c.r == 4; }},
      {"lora_target_modules: [k_proj, q_proj]", "lora_target_modules -> target_modules",
       [](auto& c) { return c.target_modules == std::vector<std::string>{"q_proj", "k_proj"}; }},
      {"lora_target: q_proj,v_proj", "lora_target -> target_modules",
       [](auto& c) { return c.target_modules == std::vector<std::string>{"q_proj", "v_proj"}; }},
      {"lora_target: all", "target_modules: all -> all-linear", [](auto& c) { return c.target_modules == kAll; }},
      {"lora_target_linear: true\nlora_r: 4", "lora_target_linear: true -> target_modules: all-linear",
       [](auto& c) { return c.target_modules == kAll && c.r == 4; }},
      {"sample_packing: true", "sample_packing -> packing", [](auto& c) { return c.packing; }},
      {"val_size: 0.1", "val_size -> val_set_size", [](auto& c) { return c.val_set_size == 0.1; }},
      {"evaluation_strategy: epoch", "evaluation_strategy -> eval_strategy",
       [](auto& c) { return c.eval_strategy == EvalStrategy::Epoch; }},
      {"optimizer: adamw_torch_fused", "optimizer -> optim", [](auto& c) { return c.optim == Optim::AdamwTorchFused; }},
      {"optim: adamw", "optim: adamw -> adamw_torch", [](auto& c) { return c.optim == Optim::AdamwTorch; }},
      {"clip_grad_norm: 0.5", "clip_grad_norm -> max_grad_norm", [](auto& c) { return c.max_grad_norm == 0.5; }},
      {"clip_grad_norm: null", "clip_grad_norm -> max_grad_norm", [](auto& c) { return c.max_grad_norm == 0; }},
      {"log_every_n_steps: 10", "log_every_n_steps -> logging_steps", [](auto& c) { return c.logging_steps == 10; }},
      {"enable_activation_checkpointing: true", "gradient_checkpointing: true -> full",
       [](auto& c) { return c.gradient_checkpointing == Checkpointing::Full; }},
      {"gradient_checkpointing: false", "gradient_checkpointing: false -> none",
       [](auto& c) { return c.gradient_checkpointing == Checkpointing::None; }},
      {"gradient_checkpointing: unsloth", "gradient_checkpointing: unsloth -> offload",
       [](auto& c) { return c.gradient_checkpointing == Checkpointing::Offload; }},
      {"datasets:\n  - path: data/alpaca.jsonl\n    type: alpaca", "datasets[0].path -> train_file",
       [](auto& c) { return c.train_file == "data/alpaca.jsonl" && c.dataset_format == DatasetFormat::Alpaca; }},
      {"datasets:\n  - path: d.jsonl\n    type: chat_template", "dataset_format: chat_template -> messages",
       [](auto& c) { return c.dataset_format == DatasetFormat::Messages; }},
      {"adapter: qlora", "adapter: qlora -> load_in_4bit: true",
       [](auto& c) { return c.load_in_4bit && c.base_precision == BasePrecision::Nf4 && c.bnb_4bit_use_double_quant; }},
      {"adapter: lora", "adapter: lora (the default)", [](auto& c) { return !c.load_in_4bit; }},
      {"quantization_bit: 4", "quantization_bit: 4 -> load_in_4bit: true", [](auto& c) { return c.load_in_4bit; }},
      {"optimizer:\n  _component_: torch.optim.AdamW\n  lr: 1e-5\n  weight_decay: 0.01\n  betas: [0.8, 0.95]",
       "optimizer.lr -> learning_rate",
       [](auto& c) {
         return c.learning_rate == 1e-5 && c.weight_decay == 0.01 && c.adam_beta1 == 0.8 && c.adam_beta2 == 0.95 &&
                c.optim == Optim::AdamwTorch;
       }},
      {"lr_scheduler:\n  num_warmup_steps: 7", "lr_scheduler.num_warmup_steps -> warmup_steps",
       [](auto& c) { return c.warmup_steps == 7; }},
      {"warmup_steps: 0.1", "warmup_steps: 0.1 is a ratio -> warmup_ratio: 0.1",
       [](auto& c) { return c.warmup_ratio == 0.1 && c.warmup_steps == 0; }},
      {"resume_from_checkpoint: true", "resume_from_checkpoint: true -> latest",
       [](auto& c) { return c.resume_from_checkpoint == "latest"; }},
      {"bf16: auto", "bf16: auto -> true", [](auto& c) { return c.bf16; }},
      {"device: gpu", "device: gpu -> cuda", [](auto& c) { return c.device == DeviceChoice::Cuda; }},
      {"quantization_bit: 4\nquantization_method: bitsandbytes", "quantization_method: bitsandbytes (the default)",
       [](auto& c) { return c.load_in_4bit; }},
  };
  for (const AliasCase& k : cases) {
    SCOPED_TRACE(k.yaml);
    std::vector<std::string> notes;
    TrainConfig c;
    ASSERT_NO_THROW(c = parse(k.yaml, &notes));
    EXPECT_TRUE(has_note(notes, k.note)) << "notes: " << (notes.empty() ? "(none)" : notes.front());
    EXPECT_TRUE(k.check(c));
  }
}

TEST(TrainConfig, AliasesAreDocumented) {
  std::string md = config_reference_markdown();
  for (const char* alias : {"lora_r", "cutoff_len", "micro_batch_size", "sample_packing", "evaluation_strategy",
                            "log_every_n_steps", "optimizer.lr"})
    EXPECT_NE(md.find(std::string("`") + alias + "`"), std::string::npos) << alias;
  for (const ConfigKeyDoc& d : config_key_docs()) {
    EXPECT_NE(md.find("| `" + d.name + "` |"), std::string::npos) << d.name;
    EXPECT_FALSE(d.help.empty()) << d.name;
  }
}

TEST(TrainConfig, UnknownKeySuggestsTheClosest) {
  std::string path = write_yaml("typo", "r: 8\nlearnig_rate: 1e-4\n");
  Error e = expect_error([&] { load_train_config(path, {}, nullptr, false); }, ErrorKind::Config);
  EXPECT_EQ(e.message(), "unknown key 'learnig_rate'");
  EXPECT_EQ(e.hint(), "did you mean 'learning_rate'?");
  EXPECT_EQ(e.where(), path + ":2:1");
  // aliases are candidates too; transpositions count as one typo
  EXPECT_EQ(suggest_config_key("lora_rnak"), "lora_rank");
  EXPECT_EQ(suggest_config_key("gradient_acumulation_steps"), "gradient_accumulation_steps");
  EXPECT_EQ(suggest_config_key("zzzzzz"), "");
  Error o = expect_error([] { parse("", nullptr, {"warmup_ration=0.1"}); }, ErrorKind::Config);
  EXPECT_EQ(o.hint(), "did you mean 'warmup_ratio'?");
  EXPECT_NE(o.where().find("warmup_ration=0.1"), std::string::npos);
  Error n = expect_error([] { parse("optimizer:\n  lrr: 1\n"); }, ErrorKind::Config);
  EXPECT_EQ(n.message(), "unknown key 'optimizer.lrr'");
}

TEST(TrainConfig, TypeErrorsNameKeyValueAndLocation) {
  std::string path = write_yaml("types", "# comment\nr: 8\nlearning_rate:   abc\n");
  Error e = expect_error([&] { load_train_config(path, {}, nullptr, false); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), path + ":3:18");
  EXPECT_NE(e.message().find("'learning_rate'"), std::string::npos);
  EXPECT_NE(e.message().find("'abc'"), std::string::npos);

  Error a = expect_error([] { parse("lora_r: 2.5"); }, ErrorKind::Config);
  EXPECT_EQ(a.where(), "cfg.yaml:1:9");
  EXPECT_NE(a.message().find("key 'r' (given as 'lora_r')"), std::string::npos) << a.message();
  EXPECT_NE(a.message().find("not an integer"), std::string::npos);

  Error b = expect_error([] { parse("packing: maybe"); }, ErrorKind::Config);
  EXPECT_NE(b.message().find("not a boolean"), std::string::npos);
  Error c = expect_error([] { parse("target_modules: {q: 1}"); }, ErrorKind::Config);
  EXPECT_NE(c.message().find("expected a list"), std::string::npos);
  Error d = expect_error([] { parse("learning_rate: [1, 2]"); }, ErrorKind::Config);
  EXPECT_NE(d.message().find("expected a number"), std::string::npos);
  Error f = expect_error([] { parse("lr_scheduler_type: cosin"); }, ErrorKind::Config);
  EXPECT_NE(f.hint().find("did you mean 'cosine'?"), std::string::npos);
  EXPECT_NE(f.hint().find("constant_with_warmup"), std::string::npos);
  Error g = expect_error([] { parse("target_modules: [q_proj, lm_head]"); }, ErrorKind::Config);
  EXPECT_NE(g.message().find("'lm_head'"), std::string::npos);
  Error h = expect_error([] { parse("optimizer: sgd"); }, ErrorKind::Config);
  EXPECT_NE(h.hint().find("only AdamW is implemented"), std::string::npos);
  Error i = expect_error([] { parse("quant_blocksize: 48"); }, ErrorKind::Config);
  EXPECT_NE(i.hint().find("64"), std::string::npos);
  // an empty value keeps the default, as in axolotl configs
  TrainConfig empty = parse("seed:\noutput_dir:\nlora_target_modules:\nlora_target_linear: true\nadapter:\n");
  EXPECT_EQ(empty.seed, 42);
  EXPECT_EQ(empty.output_dir, "out");
  EXPECT_EQ(empty.target_modules, kAll);
  expect_error([] { parse("sed:"); }, ErrorKind::Config);  // still a known key
  expect_error([] { parse("learning_rate: .nan"); }, ErrorKind::Config);
}

TEST(TrainConfig, RangesAndCrossFieldRules) {
  for (const char* bad : {"warmup_ratio: 1.0", "warmup_ratio: -0.1", "lora_dropout: 1", "r: 0", "learning_rate: 0",
                          "num_train_epochs: 0", "max_steps: -2", "max_steps: 0", "val_set_size: 2.5",
                          "val_set_size: 0.1\neval_file: e.jsonl", "target_modules: [all-linear, q_proj]",
                          "target_modules: []", "load_in_4bit: true\nbase_precision: bf16",
                          "adapter: qlora\nbase_precision: fp8", "base_precision: nf4\nbnb_4bit_quant_type: fp4",
                          "quantization_bit: 8", "adapter: dora", "finetuning_type: freeze",
                          "finetuning_type: full\nr: 8", "finetuning_type: full\nload_in_4bit: true",
                          "finetuning_type: full\nrl: dpo",
                          "quantization_method: gptq", "per_device_train_batch_size: 0"}) {
    SCOPED_TRACE(bad);
    expect_error([&] { parse(bad); }, ErrorKind::Config);
  }
  Error e = expect_error([] { parse("r: 4\nload_in_4bit: true\nbase_precision: bf16"); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "cfg.yaml:3:17");  // points at base_precision
  // warmup_ratio just below 1 and dropout 0 are fine
  EXPECT_NO_THROW(parse("warmup_ratio: 0.99\nlora_dropout: 0"));
  // No projection adapted is fine beside target_parameters (LoRA on a mixture of experts' experts alone).
  EXPECT_TRUE(parse("target_modules: []\ntarget_parameters: [mlp.experts.down_proj]").target_modules.empty());
  EXPECT_EQ(parse("val_set_size: 200").val_set_size, 200);
}

// router_aux_loss_coef: auto (the model's own) or a number >= 0, which replaces a mixture of
// experts' coefficient and is refused on a model without experts.
TEST(TrainConfig, RouterAuxLossCoefIsAutoOrANumber) {
  EXPECT_FALSE(router_aux_loss_coef_value(parse("")).has_value());
  EXPECT_FALSE(router_aux_loss_coef_value(parse("router_aux_loss_coef: null")).has_value());
  EXPECT_EQ(router_aux_loss_coef_value(parse("router_aux_loss_coef: 0.02")), 0.02);
  EXPECT_EQ(router_aux_loss_coef_value(parse("router_aux_loss_coef: 1e-3")), 1e-3);
  EXPECT_EQ(router_aux_loss_coef_value(parse("router_aux_loss_coef: 0")), 0.0);
  for (const char* bad : {"-0.1", "much", "0.1x", "nan", "inf"}) {
    SCOPED_TRACE(bad);
    const Error e = expect_error([&] { parse(std::string("\nrouter_aux_loss_coef: ") + bad); }, ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("cfg.yaml:2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not auto or a number >= 0"), std::string::npos) << e.what();
  }
  LlamaConfig moe;
  moe.name = "m";
  moe.n_experts = 4;
  moe.router_aux_loss_coef = 0.1;
  LlamaConfig same = moe;
  apply_router_aux_loss(parse(""), same);  // auto: the model's own
  EXPECT_EQ(same.router_aux_loss_coef, 0.1);
  apply_router_aux_loss(parse("router_aux_loss_coef: 0"), moe);
  EXPECT_EQ(moe.router_aux_loss_coef, 0.0);
  apply_router_aux_loss(parse("router_aux_loss_coef: 0.02"), moe);
  EXPECT_EQ(moe.router_aux_loss_coef, 0.02);
  LlamaConfig dense;
  dense.name = "d";
  const Error e = expect_error([&] { apply_router_aux_loss(parse("router_aux_loss_coef: 0.02"), dense); }, ErrorKind::Config);
  EXPECT_NE(std::string(e.what()).find("model 'd' has no experts"), std::string::npos) << e.what();
}

TEST(TrainConfig, FourBitImplications) {
  std::vector<std::string> notes;
  TrainConfig c = parse("load_in_4bit: true", &notes);
  EXPECT_EQ(c.base_precision, BasePrecision::Nf4);
  EXPECT_TRUE(c.bnb_4bit_use_double_quant);
  EXPECT_TRUE(has_note(notes, "load_in_4bit: bnb_4bit_use_double_quant defaults to true (QLoRA)"));
  notes.clear();
  c = parse("load_in_4bit: true\nbnb_4bit_quant_type: fp4\nbnb_4bit_use_double_quant: false", &notes);
  EXPECT_EQ(c.base_precision, BasePrecision::Fp4);
  EXPECT_FALSE(c.bnb_4bit_use_double_quant);
  EXPECT_FALSE(has_note(notes, "load_in_4bit: bnb_4bit_use_double_quant defaults to true (QLoRA)"));
  c = parse("base_precision: fp4");
  EXPECT_TRUE(c.load_in_4bit);
  EXPECT_EQ(c.bnb_4bit_quant_type, BasePrecision::Fp4);
  c = parse("base_precision: nvfp4");
  EXPECT_FALSE(c.load_in_4bit);
}

TEST(TrainConfig, Overrides) {
  std::vector<std::string> notes;
  TrainConfig c = parse("learning_rate: 1e-3\nr: 8\n", &notes,
                        {"learning_rate=5e-5", "target_modules=[q_proj,v_proj]", "--lora_alpha=64",
                         "optimizer.lr=7e-5", "lora_target=k_proj, o_proj", "packing=true",
                         "chat_template={% for m in messages %}{{ m.content }}{% endfor %}", "eval_file=",
                         "output_dir=runs/a=b"});
  EXPECT_DOUBLE_EQ(c.learning_rate, 7e-5);  // later overrides win
  EXPECT_TRUE(has_note(notes, "optimizer.lr -> learning_rate"));
  EXPECT_EQ(c.r, 8);
  EXPECT_DOUBLE_EQ(c.lora_alpha, 64);
  EXPECT_EQ(c.target_modules, (std::vector<std::string>{"k_proj", "o_proj"}));
  EXPECT_TRUE(c.packing);
  EXPECT_EQ(c.chat_template, "{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_EQ(c.output_dir, "runs/a=b");
  EXPECT_EQ(parse("", nullptr, {"target_modules=[q_proj, v_proj]"}).target_modules,
            (std::vector<std::string>{"q_proj", "v_proj"}));
  // A comma string (LLaMA-Factory style): items trimmed, empty ones dropped.
  EXPECT_EQ(parse("lora_target: ' q_proj ,, v_proj,'\n").target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(parse("", nullptr, {"datasets=[{path: x.jsonl, type: sharegpt}]"}).dataset_format, DatasetFormat::ShareGpt);
  Error e = expect_error([] { parse("", nullptr, {"learning_rate"}); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "override 'learning_rate'");
  Error f = expect_error([] { parse("", nullptr, {"r=abc"}); }, ErrorKind::Config);
  EXPECT_EQ(f.where(), "override 'r=abc'");
  expect_error([] { parse("", nullptr, {"target_modules=[q_proj"}); }, ErrorKind::Config);
}

TEST(TrainConfig, DuplicateSpellingsInOneFileAreAnError) {
  Error e = expect_error([] { parse("r: 8\nlora_r: 16\n"); }, ErrorKind::Config);
  EXPECT_NE(e.message().find("already set by 'r' at cfg.yaml:1:4"), std::string::npos) << e.message();
  // the same value twice is fine (axolotl qlora configs carry both)
  EXPECT_TRUE(parse("adapter: qlora\nload_in_4bit: true\nlora_r: 8\nr: 8\n").load_in_4bit);
  expect_error([] { parse("adapter: qlora\nload_in_4bit: false\n"); }, ErrorKind::Config);
  expect_error([] { parse("train_file: x.jsonl\ndatasets:\n  - path: a.jsonl\n  - path: b.jsonl\n"); }, ErrorKind::Config);
}

TEST(TrainConfig, FileErrors) {
  Error io = expect_error([] { load_train_config("/nonexistent/dir/cfg.yaml", {}, nullptr); }, ErrorKind::Io);
  EXPECT_EQ(io.where(), "/nonexistent/dir/cfg.yaml");
  std::string path = write_yaml("syntax", "r: 8\nlearning_rate: [1e-4\nseed: 3\n");
  Error syn = expect_error([&] { load_train_config(path, {}, nullptr); }, ErrorKind::Config);
  EXPECT_EQ(syn.where().rfind(path + ":", 0), 0u) << syn.where();
  EXPECT_NE(syn.message().find("YAML syntax error"), std::string::npos);
  expect_error([] { parse("- a\n- b\n"); }, ErrorKind::Config);
  // required for train
  std::string minimal = write_yaml("min", "train_file: t.jsonl\n");
  Error req = expect_error([&] { load_train_config(minimal, {}, nullptr); }, ErrorKind::Config);
  EXPECT_NE(req.message().find("model_name_or_path"), std::string::npos);
  EXPECT_NO_THROW(load_train_config(minimal, {"base_model=m"}, nullptr));
}

TEST(TrainConfig, DumpLoadRoundTrip) {
  TrainConfig c = parse(
      "model_name_or_path: \"models/my model: v2\"\n"
      "train_file: data/train.jsonl\n"
      "val_set_size: 0.05\n"
      "learning_rate: 1.5e-4\n"
      "adam_epsilon: 1e-7\n"
      "lr_scheduler_type: constant_with_warmup\n"
      "warmup_ratio: 0.03\n"
      "target_modules: [v_proj, q_proj, down_proj]\n"
      "adapter: qlora\n"
      "resume_from_checkpoint: latest\n"
      "chat_template: \"{% for m in messages %}\\n{{ m['content'] }}{% endfor %}\"\n"
      "gradient_checkpointing: true\n"
      "per_device_train_batch_size: 2\n"
      "max_steps: 250\n"
      "use_rslora: true\n"
      "sample_prompts: [\"Hello, world: what's up?\", 'Say \"hi\" [twice]', '# not a comment']\n"
      "seed: 1234\n");
  std::string yaml = dump_train_config(c);
  for (const ConfigKeyDoc& d : config_key_docs()) EXPECT_NE(yaml.find("\n" + d.name + ":"), std::string::npos) << d.name;
  std::vector<std::string> notes;
  TrainConfig back = parse_train_config(yaml, "dump.yaml", {}, &notes, true);
  EXPECT_TRUE(back == c) << yaml;
  EXPECT_TRUE(notes.empty()) << notes.front();  // the dump is already canonical
  EXPECT_EQ(back.chat_template, "{% for m in messages %}\n{{ m['content'] }}{% endfor %}");
  EXPECT_EQ(back.sample_prompts, (std::vector<std::string>{"Hello, world: what's up?", "Say \"hi\" [twice]", "# not a comment"}));
  EXPECT_TRUE(parse(dump_train_config(TrainConfig())) == parse(""));
}

TEST(TrainConfig, SamplePromptsAreTextsNotNameLists) {
  TrainConfig d;
  EXPECT_TRUE(d.sample_prompts.empty());
  EXPECT_EQ(d.sample_max_new_tokens, 64);
  // A single prompt is one text even with commas (target_modules would split it).
  TrainConfig c = parse("sample_prompts: What is a fjord, and where are they?\nsample_max_new_tokens: 16\n");
  EXPECT_EQ(c.sample_prompts, std::vector<std::string>{"What is a fjord, and where are they?"});
  EXPECT_EQ(c.sample_max_new_tokens, 16);
  c = parse("", nullptr, {"sample_prompts=[Name a color., Count to three.]"});
  EXPECT_EQ(c.sample_prompts, (std::vector<std::string>{"Name a color.", "Count to three."}));
  c = parse("", nullptr, {"sample_prompts=Hi, who are you?"});
  EXPECT_EQ(c.sample_prompts, std::vector<std::string>{"Hi, who are you?"});
  Error e = expect_error([] { parse("sample_prompts: [ok, '  ']\n"); }, ErrorKind::Config);
  EXPECT_NE(std::string(e.what()).find("entry 2 is empty"), std::string::npos) << e.what();
  expect_error([] { parse("sample_max_new_tokens: 0\n"); }, ErrorKind::Config);
}

// Preference training under the names axolotl, LLaMA-Factory and TRL use.
TEST(TrainConfig, PreferenceKeysAndAliases) {
  TrainConfig c = parse("stage: dpo\npref_beta: 0.2\ndpo_label_smoothing: 0.1\ntruncation_mode: keep_end\n");
  EXPECT_EQ(c.rl, Objective::Dpo);
  EXPECT_EQ(c.beta, 0.2);
  EXPECT_EQ(c.label_smoothing, 0.1);
  EXPECT_EQ(c.truncation, Truncation::TruncateLeft);
  c = parse("pref_loss: simpo\nsimpo_gamma: 1.0\ncpo_alpha: 0.5\n");
  EXPECT_EQ(c.rl, Objective::Simpo);
  EXPECT_EQ(c.simpo_gamma, 1.0);
  c = parse("rl: kto\nper_device_train_batch_size: 4\nkto_desirable_weight: 1.5\nkto_rejected_weight: 0.5\nrl_beta: 0.3\n");
  EXPECT_EQ(c.desirable_weight, 1.5);
  EXPECT_EQ(c.undesirable_weight, 0.5);
  EXPECT_EQ(c.beta, 0.3);
  c = parse("rl: dpo\npref_loss: ipo\n");
  EXPECT_EQ(c.loss_type, DpoLoss::Ipo);
  EXPECT_EQ(parse("rl: cpo_simpo\n").rl, Objective::Simpo);
  for (const char* bad : {"stage: ppo\n", "pref_loss: kto_pair\n", "truncation_mode: middle\n", "rl: grpo\n",
                          "rl: orpo\nsimpo_gamma: 1.0\n", "beta: 0.5\n"}) {
    EXPECT_THROW(parse(bad), Error) << bad;
  }
}

// disable_dropout is one of auto/true/false and every objective honours it: auto drops LoRA dropout
// for the preference objectives (TRL's default) and keeps it for SFT; true and false are the user's.
TEST(TrainConfig, DisableDropoutIsHonouredByEveryObjective) {
  auto dropout = [](const std::string& yaml) { return engine_spec(parse("lora_dropout: 0.1\n" + yaml)).lora.dropout; };
  EXPECT_EQ(parse("").disable_dropout, DisableDropout::Auto);
  EXPECT_DOUBLE_EQ(dropout(""), 0.1);
  EXPECT_DOUBLE_EQ(dropout("rl: dpo\n"), 0.0);
  EXPECT_DOUBLE_EQ(dropout("disable_dropout: true\n"), 0.0);
  EXPECT_DOUBLE_EQ(dropout("disable_dropout: false\n"), 0.1);
  EXPECT_DOUBLE_EQ(dropout("rl: dpo\ndisable_dropout: false\n"), 0.1);
  EXPECT_DOUBLE_EQ(dropout("rl: kto\nper_device_train_batch_size: 4\ndisable_dropout: ~\n"), 0.0);  // null: auto
  EXPECT_EQ(parse("disable_dropout: no\n").disable_dropout, DisableDropout::No);
  expect_error([] { parse("disable_dropout: sometimes\n"); }, ErrorKind::Config);
}

// finetuning_type is a canonical key: lora (the default) or full, parsed once into the mode.
TEST(TrainConfig, FinetuningTypeFull) {
  EXPECT_EQ(parse("").finetuning_type, FinetuningType::Lora);
  const TrainConfig c = parse("finetuning_type: full");
  EXPECT_EQ(c.finetuning_type, FinetuningType::Full);
  EXPECT_EQ(engine_spec(c).method, Method::Full);
  EXPECT_EQ(engine_spec(parse("")).method, Method::Lora);
  Error e = expect_error([] { parse("finetuning_type: full\nlora_alpha: 8"); }, ErrorKind::Config);
  EXPECT_NE(std::string(e.what()).find("lora_alpha applies to finetuning_type: lora"), std::string::npos) << e.what();
}
