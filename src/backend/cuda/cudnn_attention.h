// The CUDA backend's choice between cuDNN's fused attention (SDPA, sm_90 and sm_100) and its own
// flash-attention kernel, and the cuDNN path itself (cudnn_attention.cu). Internal header.
#pragma once
#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace qlora::cuda {

class CudaBackend;

// QLORA_ATTENTION_KERNEL: auto (default: cuDNN where it applies, else the own kernel), cudnn
// (cuDNN or an Unsupported error naming why not), own (the own kernel everywhere). Any other
// value is a Config error.
enum class AttnKernel { Auto, Cudnn, Own };
AttnKernel attention_kernel_setting();

// Runs attention_fwd / attention_bwd through cuDNN when the setting and the call allow it
// (returns true), else returns false and the caller runs its own kernel. Arguments are checked
// by the caller.
bool cudnn_attention_fwd(CudaBackend& be, const AttentionFwdArgs& a, int64_t t_kv);
bool cudnn_attention_bwd(CudaBackend& be, const AttentionBwdArgs& a);

// "" when cuDNN takes a call with these properties on `be`, else why not (for errors and tests;
// a backend that is not the CUDA backend is refused).
std::string cudnn_attention_refusal(Backend& be, int64_t b, int64_t t, int64_t t_kv, int64_t hq, int64_t d,
                                    bool seg, int64_t n_docs, int64_t window = 0);
// cuDNN SDPA graphs executed and distinct graphs built by `be` so far (tests, benchmarks); 0 for
// a backend that is not the CUDA backend.
int64_t cudnn_attention_runs(const Backend& be);
int64_t cudnn_attention_graphs(const Backend& be);

// Frees the cuDNN handle and plans of `be` (its release()).
void cudnn_attention_release(CudaBackend& be) noexcept;

}  // namespace qlora::cuda
