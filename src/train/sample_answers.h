// Sample answers: prompts rendered as user turns, answered greedily by the Generator and decoded;
// what the trainer prints before and after training and what `qlora generate` prints.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/decoder_model.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace qlora {

// Ids that end an answer: the tokenizer's EOS, the config's eos_token_id and the end-of-turn tokens
// chat templates close a reply with (<|im_end|>, <|eot_id|>, <|end|>, <end_of_turn>, ...) that the
// vocabulary has.
std::vector<int32_t> generation_stop_ids(const Tokenizer& tok, const LlamaConfig& cfg);

// A prompt as model input. With a chat template: [{role: user, content: prompt}] rendered with
// add_generation_prompt and encoded without added specials (the template writes them). Without one
// (render empty): the raw text after the tokenizer's special prefix (BOS where it adds one).
std::vector<int32_t> encode_prompt(const std::string& prompt, const ChatRenderFn& render, const Tokenizer& tok);

struct SampleAnswer {
  std::string prompt, answer;  // answer decoded with special tokens skipped
  int64_t prompt_tokens = 0, new_tokens = 0;
  double seconds = 0;          // prefill + decode
};

class Generator;

// Greedy answers to each prompt from the generator's model as it is now.
std::vector<SampleAnswer> sample_answers(Generator& gen, const Tokenizer& tok, const ChatRenderFn& render,
                                         const std::vector<std::string>& prompts, int64_t max_new_tokens);
// The model's greedy answers as it is now (one Generator, built once, for all prompts).
std::vector<SampleAnswer> sample_answers(DecoderModel& model, const Tokenizer& tok, const ChatRenderFn& render,
                                         const std::vector<std::string>& prompts, int64_t max_new_tokens);

// "  prompt: ...\n  answer: ...\n" per answer, continuation lines indented under the text.
std::string format_sample_answers(const std::vector<SampleAnswer>& answers);
// One line: "N prompts, M new tokens in S s (T tokens/s)".
std::string sample_answers_speed(const std::vector<SampleAnswer>& answers);
// [{prompt, answer}, ...]
nlohmann::ordered_json sample_answers_json(const std::vector<SampleAnswer>& answers);

}  // namespace qlora
