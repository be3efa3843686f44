// GPU catalog for planning: memory, bandwidths and dense tensor peaks of each device, and the
// `custom:key=value,...` syntax for anything not listed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/modes.h"

namespace qlora {

struct GpuSpec {
  std::string name;                  // catalog key, e.g. "h100-sxm"
  std::string display;               // "NVIDIA H100 SXM 80GB"
  std::vector<std::string> aliases;  // other accepted spellings ("h100", ...)
  int64_t mem_bytes = 0;             // device memory; "GB" capacities are binary (HBM stacks are 2^30)
  double mem_bw = 0;                 // device memory bandwidth, bytes/s
  double bf16_tflops = 0;            // dense tensor-core peak with fp32 accumulate, TFLOP/s
  double fp8_tflops = 0;             // 0 = no such tensor-core path
  double fp4_tflops = 0;
  bool sm100 = false;                // datacenter Blackwell (compute capability 10.x): the engine's FP4 GEMM runs
  double link_bw = 0;                // GPU-GPU inside a node, bytes/s per direction
  double net_bw = 0;                 // node-to-node per GPU (its NIC share), bytes/s per direction
  double host_bw = 0;                // host <-> device (activation offload), bytes/s per direction
  int max_gpus_per_node = 8;         // size of the fast (NVLink/xGMI/scale-up) domain
  bool has_backend = true;           // qlora has a backend for it (CUDA sm_80+); planning works either way
  std::string source;                // where the figures come from (short)

  // The host CPU as a device (`--gpu cpu`): the rates below were measured on this machine by a
  // calibration run (src/plan/cpu_device.h), so the speed model uses them as achieved rates
  // (efficiency 1) and plans f32 compute. bf16_tflops then holds the f32 GEMM rate.
  bool is_cpu = false;
  double lora_tflops = 0;            // f32 GEMMs with one dimension = the LoRA rank
  double attn_tflops = 0;            // our causal attention, forward + backward, counted FLOPs
  double ce_elems_per_s = 0;         // fused cross-entropy (loss + dlogits), logits per second
  double dequant_elems_per_s = 0;    // 4-bit (NF4) weights dequantized to f32 per second
  int64_t program_bytes = 0;         // resident memory of this process when the device was resolved:
                                     // the program and libraries a run loads too, outside the arena

  // Dense peak TFLOP/s for a GEMM dtype; 0 when unsupported.
  double peak_tflops(GemmDtype gemm_dtype) const;
};

const std::vector<GpuSpec>& gpu_catalog();
// Catalog keys, for messages.
std::vector<std::string> gpu_names();

// A catalog name or alias (case-insensitive, '-', '_' and ' ' ignored), or "custom:..." syntax.
// Unknown names: Error(Config) listing the catalog and suggesting the closest name.
GpuSpec resolve_gpu(const std::string& name);

// The catalog entry for a device as the CUDA driver names it (cudaDeviceProp::name, e.g. "NVIDIA
// H100 80GB HBM3") with `mem_bytes` of device memory to tell memory variants apart; nullptr when
// no entry matches for sure (H100 PCIe, H200 NVL and other unlisted parts): callers then report no
// peak rather than a wrong one.
const GpuSpec* gpu_for_device_name(const std::string& device_name, int64_t mem_bytes);

// "custom:mem=80GB,bw=3.35TB/s,bf16=989[,fp8=1979][,fp4=0][,link=450GB/s][,net=50GB/s][,host=64GB/s]
//  [,gpus_per_node=8][,name=my-gpu]". Memory units GB|GiB|TB (binary, as in the catalog) or bare bytes;
// bandwidth units GB/s|TB/s (decimal); TFLOP/s as bare numbers. mem, bw and bf16 are required.
GpuSpec parse_custom_gpu(const std::string& spec);

}  // namespace qlora
