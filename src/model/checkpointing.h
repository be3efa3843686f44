// Activation checkpointing, the engine's mode for what the backward recomputes: parsed once from
// its key (gradient_checkpointing in a config, --checkpointing / --gradient-checkpointing on the
// command line) and compared as a type everywhere else.
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

}  // namespace qlora
