// The single-process side of src/dist/: shares of uneven splits, launcher detection from the
// environment, and that a plain process never starts the MPI runtime.
#include <gtest/gtest.h>

#include <mpi.h>

#include <cstdlib>

#include "dist/comm.h"

using namespace qlora;

TEST(Slice, SharesCoverEverythingOnceAndDifferByAtMostOne) {
  for (size_t n : {0u, 1u, 2u, 5u, 10u, 1000u, 1001u})
    for (int w : {1, 2, 3, 4, 7}) {
      size_t next = 0, lo = n, hi = 0;
      for (int r = 0; r < w; r++) {
        const Slice s = slice_of(n, r, w);
        EXPECT_EQ(s.begin, next) << n << " " << w << " " << r;
        next = s.end();
        lo = std::min(lo, s.count);
        hi = std::max(hi, s.count);
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(hi - lo, 1u);
    }
  EXPECT_EQ(slice_of(10, 0, 3).count, 3u);
  EXPECT_EQ(slice_of(10, 1, 3).count, 3u);
  EXPECT_EQ(slice_of(10, 2, 3).count, 4u);
}

namespace {
const char* const kLauncherVars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"};
struct CleanEnv {
  CleanEnv() {
    for (const char* v : kLauncherVars) unsetenv(v);
  }
  ~CleanEnv() {
    for (const char* v : kLauncherVars) unsetenv(v);
  }
};
}  // namespace

TEST(Launcher, DetectedFromEachLaunchersEnvironment) {
  CleanEnv clean;
  EXPECT_EQ(detect_launcher(), "");
  setenv("SLURM_STEP_NUM_TASKS", "1", 1);  // srun of one task: a plain process
  EXPECT_EQ(detect_launcher(), "");
  setenv("SLURM_STEP_NUM_TASKS", "4", 1);
  EXPECT_EQ(detect_launcher(), "srun");
  unsetenv("SLURM_STEP_NUM_TASKS");
  setenv("PMI_RANK", "0", 1);
  EXPECT_NE(detect_launcher().find("PMI"), std::string::npos);
  unsetenv("PMI_RANK");
  setenv("PMIX_RANK", "0", 1);
  EXPECT_EQ(detect_launcher(), "PMIx");
  unsetenv("PMIX_RANK");
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_EQ(detect_launcher(), "mpirun (Open MPI)");
}

TEST(Launcher, PlainProcessIsOneRankWithoutStartingMpi) {
  CleanEnv clean;
  auto comm = make_comm(10);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->local_rank(), 0);
  EXPECT_EQ(comm->describe(), "single process");
  float f[3] = {1.5f, -2.f, 3.f};
  comm->allreduce_sum(f, 3);  // the sum over one rank is the value itself
  EXPECT_EQ(f[0], 1.5f);
  EXPECT_EQ(f[1], -2.f);
  const uint8_t shard[5] = {9, 8, 7, 6, 5};  // one rank holds the whole blob: the gather is a copy
  uint8_t full[5] = {};
  comm->allgather_shards(shard, full, 5);
  for (int i = 0; i < 5; i++) EXPECT_EQ(full[i], shard[i]) << i;
  int inited = 1;
  MPI_Initialized(&inited);
  EXPECT_EQ(inited, 0) << "a plain process must not start the MPI runtime";
}

#include "dist/local_device.h"

TEST(LocalGpu, EachLocalRankGetsOneDeviceOfTheVisibleList) {
  unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(bind_local_gpu(0, 1), "");  // one rank on the node: untouched
  EXPECT_EQ(getenv("CUDA_VISIBLE_DEVICES"), nullptr);
  EXPECT_EQ(bind_local_gpu(3, 4), "3");
  EXPECT_STREQ(getenv("CUDA_VISIBLE_DEVICES"), "3");
  setenv("CUDA_VISIBLE_DEVICES", "4,5, 6,7", 1);
  EXPECT_EQ(bind_local_gpu(2, 4), "6");
  EXPECT_STREQ(getenv("CUDA_VISIBLE_DEVICES"), "6");
  setenv("CUDA_VISIBLE_DEVICES", "GPU-abc", 1);  // srun --gpus-per-task=1: already this rank's
  EXPECT_EQ(bind_local_gpu(1, 2), "");
  EXPECT_STREQ(getenv("CUDA_VISIBLE_DEVICES"), "GPU-abc");
  unsetenv("CUDA_VISIBLE_DEVICES");
}
