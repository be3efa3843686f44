// Typed errors that name the file/line/key at fault and carry a hint; only main() exits.
#pragma once
#include <stdexcept>
#include <string>

namespace qlora {

enum class ErrorKind { Io, Format, Config, Shape, Unsupported, Data, Internal };

const char* error_kind_name(ErrorKind k);

class Error : public std::runtime_error {
 public:
  // where: "path/to/file:12:3", "config key 'learning_rate'", "tensor 'model.norm.weight'" ...
  Error(ErrorKind kind, std::string where, std::string what, std::string hint = "");
  ErrorKind kind() const { return kind_; }
  const std::string& where() const { return where_; }
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }

 private:
  ErrorKind kind_;
  std::string where_, message_, hint_;
};

[[noreturn]] void fail(ErrorKind kind, const std::string& where, const std::string& what,
                       const std::string& hint = "");

}  // namespace qlora

// Internal invariant: a bug in qlora, not bad input.
#define QLORA_ASSERT(cond)                                                                   \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::qlora::fail(::qlora::ErrorKind::Internal, std::string(__FILE__) + ":" +              \
                                                      std::to_string(__LINE__),              \
                    "assertion failed: " #cond);                                             \
  } while (0)
