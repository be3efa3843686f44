// qlora entry point: dispatches subcommands; the only place that turns errors into exit codes.
#include <cstdio>
#include <exception>

#include "core/error.h"

int main(int argc, char** argv) {
  try {
    std::fprintf(stderr, "qlora: no subcommands yet\n");
    return 2;
  } catch (const qlora::Error& e) {
    std::fprintf(stderr, "qlora: %s\n", e.what());
    return 1;
  }
}
