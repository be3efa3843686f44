// The seven projections of a decoder layer by index (the order of all_linear_targets()), for the
// model's own files: arrays of per-projection state are indexed by these.
#pragma once

namespace qlora {

enum Proj : int { Q = 0, K, V, O, G, U, D };
inline constexpr const char* kProj[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

}  // namespace qlora
