// Subcommand entry points; each parses its own arguments (argv[0] is the subcommand name).
#pragma once

namespace qlora {

int cmd_train(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_merge(int argc, char** argv);
int cmd_data(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_plot(int argc, char** argv);
int cmd_export(int argc, char** argv);

}  // namespace qlora
