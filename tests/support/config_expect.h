// What makes two Llama-family configs compute the same, for tests that read one model two ways.
#pragma once
#include <gtest/gtest.h>

#include "model/llama_config.h"

namespace qlora::testing_util {

// What makes two configs compute the same.
inline void expect_same_math(const LlamaConfig& a, const LlamaConfig& b) {
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_head_kv, b.n_head_kv);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rope_dim(), b.rope_dim());
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(rope_inv_freq(a), rope_inv_freq(b));
  EXPECT_EQ(rope_inv_freq(a, true), rope_inv_freq(b, true));
  EXPECT_EQ(rope_attention_scale(a), rope_attention_scale(b));
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings * (a.rope_scaling.type == "longrope"),
            b.rope_scaling.original_max_position_embeddings * (b.rope_scaling.type == "longrope"));
  EXPECT_EQ(rope_local_inv_freq(a), rope_local_inv_freq(b));
  EXPECT_EQ(a.fused_qkv, b.fused_qkv);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.norm_unit_offset, b.norm_unit_offset);
  EXPECT_EQ(a.sandwich_norms, b.sandwich_norms);
  EXPECT_EQ(a.scale_embeddings, b.scale_embeddings);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.attn_logit_softcapping, b.attn_logit_softcapping);
  EXPECT_EQ(a.final_logit_softcapping, b.final_logit_softcapping);
  EXPECT_EQ(a.attn_scale(), b.attn_scale());
  for (int64_t l = 0; l < a.n_layer; l++) {
    EXPECT_EQ(a.window_of(l), b.window_of(l)) << "layer " << l;
    EXPECT_EQ(a.local_rope(l), b.local_rope(l)) << "layer " << l;
  }
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.experts_per_tok, b.experts_per_tok);
  EXPECT_EQ(a.moe() ? a.expert_intermediate_size : 0, b.moe() ? b.expert_intermediate_size : 0);
  EXPECT_EQ(a.moe() && a.norm_topk_prob, b.moe() && b.norm_topk_prob);
  EXPECT_EQ(a.router_aux_loss_coef, b.router_aux_loss_coef);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
}

}  // namespace qlora::testing_util
