// The engine's modes as types: each parsed once from its key (a config key or a command-line
// flag, named in the error) and compared as a type everywhere else.
#pragma once
#include <string>
#include <vector>

namespace qlora {

// None: every layer's activations are kept for the backward. Full: only each layer's input is
// kept, and the layer's forward runs again in the backward. Offload: as Full, with the kept
// inputs in pinned host memory.
enum class Checkpointing { None, Full, Offload };

const char* checkpointing_name(Checkpointing c);  // "none" | "full" | "offload"
// none | full | offload; anything else is an Error(Config) naming `key`, the value and the closest
// choice.
Checkpointing parse_checkpointing(const std::string& value, const std::string& key);
// None, Full, Offload: the order reports list them in.
const std::vector<Checkpointing>& checkpointing_modes();
inline bool recomputes(Checkpointing c) { return c != Checkpointing::None; }

// The tensor-core dtype of the frozen base's forward GEMMs (gemm_dtype, --gemm-dtype; what each
// needs of the base and the device: model/gemm_dtype.h). Bf16: the base is dequantized a layer
// ahead. Fp8: an fp8 base read as stored. Fp4: an NVFP4/MXFP4 base read as stored.
enum class GemmDtype { Bf16, Fp8, Fp4 };

const char* gemm_dtype_name(GemmDtype g);  // "bf16" | "fp8" | "fp4"
GemmDtype parse_gemm_dtype(const std::string& value, const std::string& key);

}  // namespace qlora
