// Host-only: the attention kernels' dynamic shared memory straight from their tile traits.
#include "backend/cuda/attention_mma.cuh"
#include "dynamic_smem.h"

namespace qlora::cuda_static {

std::vector<DynamicSmem> attention_dynamic_smem() {
  using namespace qlora::cuda::attn;
  return {{"qlora::cuda::attn::attn_fwd_kernel<64>(", FwdTraits<64>::kSmemBytes},
          {"qlora::cuda::attn::attn_fwd_kernel<128>(", FwdTraits<128>::kSmemBytes},
          {"qlora::cuda::attn::attn_bwd_kernel<64, true, false>(", BwdTraits<64>::kSmemBytes},
          {"qlora::cuda::attn::attn_bwd_kernel<128, true, false>(", BwdTraits<128>::kSmemBytes},
          {"qlora::cuda::attn::attn_bwd_kernel<64, false, false>(", BwdTraits<64>::kSmemBytes},
          {"qlora::cuda::attn::attn_bwd_kernel<128, false, false>(", BwdTraits<128>::kSmemBytes},
          {"qlora::cuda::attn::attn_bwd_kernel<64, false, true>(", BwdTraits<64>::kSmemBytes},  // soft-capped
          {"qlora::cuda::attn::attn_bwd_kernel<128, false, true>(", BwdTraits<128>::kSmemBytes},
          {"qlora::cuda::attn::attn_bwd_dq_kernel<64>(", DqTraits<64>::kSmemBytes},
          {"qlora::cuda::attn::attn_bwd_dq_kernel<128>(", DqTraits<128>::kSmemBytes},
          {"qlora::cuda::attn::attn_fwd_kernel<256>(", FwdTraits<256>::kSmemBytes},  // Gemma's head dim
          {"qlora::cuda::attn::attn_bwd_kernel<256, false, false>(", BwdTraits<256>::kSmemBytes},
          {"qlora::cuda::attn::attn_bwd_kernel<256, false, true>(", BwdTraits<256>::kSmemBytes},
          {"qlora::cuda::attn::attn_bwd_dq_kernel<256>(", DqTraits<256>::kSmemBytes}};
}

}  // namespace qlora::cuda_static
