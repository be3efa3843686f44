// `qlora train CONFIG.yaml [key=value ...]`: fine-tune and write a PEFT adapter; under mpirun or
// srun, one data-parallel rank per process.
#include <omp.h>

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/cpu/cpu_blas_check.h"
#include "cli/backend_select.h"
#include "cli/commands.h"
#include "core/error.h"
#include "dist/comm.h"
#include "dist/local_device.h"
#include "train/engine_config.h"
#include "train/train_config.h"
#include "train/trainer.h"
#ifdef QLORA_HAVE_NCCL
#include "dist/nccl/nccl_reducer.h"
#endif

namespace qlora {

static int train_on_ranks(const std::string& config, const std::vector<std::string>& overrides, Comm& comm) {
  std::vector<std::string> notes;
  TrainConfig cfg = load_train_config(config, overrides, &notes);
  comm.set_timeout(cfg.ddp_timeout);
  if (comm.rank() == 0)
    for (const auto& n : notes) std::fprintf(stderr, "config: %s\n", n.c_str());
  if (comm.size() > 1) {
    bind_local_gpu(comm.local_rank(), comm.local_size());  // one GPU per local rank (before CUDA starts)
    // Ranks sharing a node share its cores: threads: 0 means this rank's part of them.
    if (cfg.threads == 0) cfg.threads = std::max(1, omp_get_num_procs() / comm.local_size());
  }
  auto be = select_backend(device_choice_name(cfg.device), int(cfg.threads), /*quiet=*/comm.rank() != 0);  // rank 0 speaks for all
  // Every rank checks its own BLAS kernels (ranks may run on other machines); a wrong one stops the run.
  if (be->device() == DeviceKind::Cpu) {
    const std::string checked = cpu::verify_blas_kernels();
    if (comm.rank() == 0) std::fprintf(stderr, "cpu: %s\n", checked.c_str());
  }
  // GPU ranks sum gradients (sharding none) or gather fsdp's base layers in device memory; ZeRO-1's
  // reduce-scatter and all-gather of the gradients go through host memory over MPI.
  std::unique_ptr<DeviceReducer> nccl;
#ifdef QLORA_HAVE_NCCL
  const Sharding sharding = engine_spec(cfg).sharding;
  if (comm.size() > 1 && be->device() == DeviceKind::Cuda && (sharding == Sharding::None || sharding == Sharding::Fsdp))
    nccl = make_nccl_reducer(comm, cfg.ddp_timeout);
#endif
  Trainer trainer(cfg, *be, &comm, nccl.get());
  TrainSummary s = trainer.run();
  return s.interrupted ? 130 : 0;
}

int cmd_train(int argc, char** argv) {
  CLI::App app{"Fine-tune a Llama-family model with LoRA/QLoRA.\n"
               "Keys use Hugging Face TrainingArguments/PEFT names; axolotl, LLaMA-Factory and torchtune\n"
               "aliases are accepted and reported. Example: qlora train examples/tiny.yaml max_steps=20\n"
               "Data parallel: mpirun -np N qlora train ... or srun qlora train ... (docs/distributed.md).",
               "qlora train"};
  std::string config;
  std::vector<std::string> overrides;
  bool help_config = false;
  app.add_option("config", config, "YAML config file");
  app.add_option("overrides", overrides, "key=value overrides, applied after the file");
  app.add_flag("--help-config", help_config, "print every config key with its default and aliases");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (help_config) {
    std::printf("%s", config_reference_markdown().c_str());
    return 0;
  }
  if (config.empty()) {
    std::fprintf(stderr, "%s", app.help().c_str());
    return 2;
  }
  // MPI starts here only when a launcher started this process; the timeout is the config's once read.
  std::unique_ptr<Comm> comm = make_comm(1800);
  if (comm->size() == 1) return train_on_ranks(config, overrides, *comm);
  // One rank's error is invisible to the others, which would wait for it in the next collective:
  // name the rank and end the whole job now.
  try {
    return train_on_ranks(config, overrides, *comm);
  } catch (const Error& e) {
    std::fprintf(stderr, "qlora train: [rank %d of %d] %s\n", comm->rank(), comm->size(), e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qlora train: [rank %d of %d] unexpected error: %s\n", comm->rank(), comm->size(), e.what());
  }
  std::fflush(stderr);
  comm->abort(1);
  return 1;  // not reached
}

}  // namespace qlora
