// Where the engine keeps what it can make again: $QLORA_CACHE_DIR, else $XDG_CACHE_HOME/qlora,
// else ~/.cache/qlora (empty when none of these is set).
#pragma once
#include <filesystem>

namespace qlora {

std::filesystem::path user_cache_dir();

}  // namespace qlora
