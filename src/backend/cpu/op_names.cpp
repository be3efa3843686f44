// The op name list, generated from QLORA_BACKEND_OPS.
#include "backend/backend.h"

namespace qlora {

const std::vector<std::string>& backend_op_names() {
  static const std::vector<std::string> names = {
#define QLORA_OP_NAME(op, Args) #op,
      QLORA_BACKEND_OPS(QLORA_OP_NAME)
#undef QLORA_OP_NAME
  };
  return names;
}

}  // namespace qlora
