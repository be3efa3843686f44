// Error type implementation.
#include "core/error.h"

namespace qlora {

const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::Io: return "io error";
    case ErrorKind::Format: return "format error";
    case ErrorKind::Config: return "config error";
    case ErrorKind::Shape: return "shape error";
    case ErrorKind::Unsupported: return "unsupported";
    case ErrorKind::Data: return "data error";
    case ErrorKind::Internal: return "internal error";
  }
  return "error";
}

static std::string compose(ErrorKind kind, const std::string& where, const std::string& what,
                           const std::string& hint) {
  std::string s = error_kind_name(kind);
  if (!where.empty()) s += ": " + where;
  s += ": " + what;
  if (!hint.empty()) s += " (hint: " + hint + ")";
  return s;
}

Error::Error(ErrorKind kind, std::string where, std::string what, std::string hint)
    : std::runtime_error(compose(kind, where, what, hint)),
      kind_(kind), where_(std::move(where)), message_(std::move(what)), hint_(std::move(hint)) {}

void fail(ErrorKind kind, const std::string& where, const std::string& what, const std::string& hint) {
  throw Error(kind, where, what, hint);
}

}  // namespace qlora
