// cuDNN SDPA graph descriptions (cudnn_sdpa_graph.h): packed ragged bf16 Q/K/V/O, causal and
// padding masks, a sliding window as the diagonal band's left bound, GQA, f32 stats, with the cuDNN
// frontend's graph API.
#if QLORA_HAVE_CUDNN  // built only with cuDNN and the frontend headers (cmake/cudnn_frontend.cmake)
#include "backend/cuda/cudnn_sdpa_graph.h"

#include <cudnn_frontend.h>

namespace qlora::cuda::sdpa {

namespace fe = cudnn_frontend;
using TA = fe::graph::Tensor_attributes;

namespace {

// An int32 (entries+1, 1, 1, 1) ragged offset tensor.
std::shared_ptr<TA> offsets(fe::graph::Graph& g, const char* name, int64_t uid, int64_t entries) {
  return g.tensor(TA().set_name(name).set_uid(uid).set_dim({entries + 1, 1, 1, 1}).set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

// A (entries, h, s, d) bf16 tensor in (B,T,H,D) memory: token-major, heads inside a token.
std::shared_ptr<TA> thd(fe::graph::Graph& g, const char* name, int64_t uid, const Shape& sh, int64_t h,
                        std::shared_ptr<TA> off) {
  return g.tensor(TA().set_name(name).set_uid(uid).set_dim({sh.entries, h, sh.s, sh.d})
                      .set_stride({sh.s * h * sh.d, sh.d, h * sh.d, 1}).set_ragged_offset(off));
}

}  // namespace

int64_t entries_bucket(int64_t n) {
  int64_t e = 1;
  while (e < n) e *= 2;
  return e;
}

std::string describe_shape(const Shape& sh) {
  return std::string(sh.backward ? "bwd" : "fwd") + " entries=" + std::to_string(sh.entries) +
         " s=" + std::to_string(sh.s) + " tokens=" + std::to_string(sh.tokens) + " hq=" + std::to_string(sh.hq) +
         " hkv=" + std::to_string(sh.hkv) + " d=" + std::to_string(sh.d) +
         (sh.window > 0 ? " window=" + std::to_string(sh.window) : std::string());
}

std::shared_ptr<fe::graph::Graph> describe(const Shape& sh, int sm) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (sm > 0) g->set_sm_version(sm);
  auto seq_q = g->tensor(TA().set_name("seq_len_q").set_uid(kSeqLenQ).set_dim({sh.entries, 1, 1, 1})
                             .set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::INT32));
  auto seq_kv = g->tensor(TA().set_name("seq_len_kv").set_uid(kSeqLenKv).set_dim({sh.entries, 1, 1, 1})
                              .set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::INT32));
  auto q = thd(*g, "Q", kQ, sh, sh.hq, offsets(*g, "off_q", kOffQ, sh.entries));
  auto k = thd(*g, "K", kK, sh, sh.hkv, offsets(*g, "off_k", kOffK, sh.entries));
  auto v = thd(*g, "V", kV, sh, sh.hkv, offsets(*g, "off_v", kOffV, sh.entries));
  // Stats (entries, hq, s, 1) in (B,Hq,T) memory, the layout the own kernel uses too: both paths
  // hand attention_bwd the same lse.
  auto stats_off = offsets(*g, "off_stats", kOffStats, sh.entries);
  const std::vector<int64_t> stats_dim{sh.entries, sh.hq, sh.s, 1}, stats_stride{sh.hq * sh.s, sh.s, 1, 1};

  if (!sh.backward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("sdpa_fwd")
                    .set_generate_stats(true)
                    .set_attn_scale(sh.scale)
                    .set_causal_mask(true)
                    .set_padding_mask(true)
                    .set_seq_len_q(seq_q)
                    .set_seq_len_kv(seq_kv)
                    .set_max_total_seq_len_q(sh.tokens)
                    .set_max_total_seq_len_kv(sh.tokens);
    // Keys j with j + window > i stay (the frontend's sliding_window_mask, top-left aligned).
    if (sh.window > 0) opts.set_diagonal_band_left_bound(int(sh.window));
    auto [o, stats] = g->sdpa(q, k, v, opts);
    o->set_output(true).set_uid(kO).set_dim({sh.entries, sh.hq, sh.s, sh.d})
        .set_stride({sh.s * sh.hq * sh.d, sh.d, sh.hq * sh.d, 1})
        .set_ragged_offset(offsets(*g, "off_o", kOffO, sh.entries));
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dim)
        .set_stride(stats_stride).set_ragged_offset(stats_off);
    return g;
  }
  auto o = thd(*g, "O", kO, sh, sh.hq, offsets(*g, "off_o", kOffO, sh.entries));
  auto dout = thd(*g, "dO", kdO, sh, sh.hq, offsets(*g, "off_do", kOffdO, sh.entries));
  auto stats = g->tensor(TA().set_name("stats").set_uid(kStats).set_dim(stats_dim).set_stride(stats_stride)
                             .set_data_type(fe::DataType_t::FLOAT).set_ragged_offset(stats_off));
  auto opts = fe::graph::SDPA_backward_attributes()
                  .set_name("sdpa_bwd")
                  .set_attn_scale(sh.scale)
                  .set_causal_mask(true)
                  .set_padding_mask(true)
                  .set_seq_len_q(seq_q)
                  .set_seq_len_kv(seq_kv)
                  .set_max_total_seq_len_q(sh.tokens)
                  .set_max_total_seq_len_kv(sh.tokens);
  if (sh.window > 0) opts.set_diagonal_band_left_bound(int(sh.window));
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
  dq->set_output(true).set_uid(kdQ).set_dim({sh.entries, sh.hq, sh.s, sh.d})
      .set_stride({sh.s * sh.hq * sh.d, sh.d, sh.hq * sh.d, 1}).set_ragged_offset(offsets(*g, "off_dq", kOffdQ, sh.entries));
  dk->set_output(true).set_uid(kdK).set_dim({sh.entries, sh.hkv, sh.s, sh.d})
      .set_stride({sh.s * sh.hkv * sh.d, sh.d, sh.hkv * sh.d, 1}).set_ragged_offset(offsets(*g, "off_dk", kOffdK, sh.entries));
  dv->set_output(true).set_uid(kdV).set_dim({sh.entries, sh.hkv, sh.s, sh.d})
      .set_stride({sh.s * sh.hkv * sh.d, sh.d, sh.hkv * sh.d, 1}).set_ragged_offset(offsets(*g, "off_dv", kOffdV, sh.entries));
  return g;
}

std::string validate(fe::graph::Graph& g) {
  fe::error_t e = g.validate();
  if (e.is_good()) return "";
  return "cudnn_frontend error " + std::to_string(int(e.get_code())) + ": " + e.get_message();
}

}  // namespace qlora::cuda::sdpa

#endif  // QLORA_HAVE_CUDNN
