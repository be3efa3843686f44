// The prepared-data cache across real ranks (ctest runs this under mpirun -np 2 and -np 3): rank 0
// prepares and writes the file while the others wait for its word, then map it (they never
// tokenize); every rank holds the same rows; rank 0's data error stops every rank, the others
// naming rank 0.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "dist/comm.h"
#include "train/model_source.h"
#include "train/train_config.h"
#include "train/train_data.h"

using namespace qlora;

namespace {

Comm* g_comm = nullptr;
const std::string kFx = QLORA_FIXTURES;

// A folder every rank names the same (rank 0's temp dir, broadcast).
std::string shared_dir(const std::string& name) {
  char buf[512] = {};
  if (g_comm->rank() == 0) {
    const std::string d = (std::filesystem::temp_directory_path() / ("qlora_ranks_" + name + "_" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    std::snprintf(buf, sizeof buf, "%s", d.c_str());
  }
  g_comm->broadcast(buf, sizeof buf, 0);
  return buf;
}

TrainConfig config(const std::string& cache, const std::string& train_file) {
  return parse_train_config("model_name_or_path: " + kFx + "/models/pref_tiny\ntrain_file: " + train_file +
                                "\nmax_length: 48\npacking: true\nval_set_size: 2\ndataset_prepared_path: " + cache + "\n",
                            "cfg.yaml", {}, nullptr, false);
}

uint64_t fingerprint(const TrainData& d) {
  uint64_t h = 1469598103934665603ull;
  for (const ExampleSet* s : {&d.train, &d.eval})
    for (const Example& e : *s)
      for (const auto* v : {&e.ids, &e.labels, &e.doc_lens})
        for (int32_t x : *v) h = (h ^ uint64_t(uint32_t(x))) * 1099511628211ull;
  return h;
}

}  // namespace

TEST(DataCacheRanks, RankZeroPreparesTheOthersMapItsFile) {
  const std::string dir = shared_dir("cache");
  const ModelSource src = open_model_source(kFx + "/models/pref_tiny");
  const TrainConfig cfg = config(dir, kFx + "/text/datasets/text.jsonl");
  const TrainData d = load_train_data(cfg, src, [](const std::string&) {}, g_comm);
  ASSERT_FALSE(d.cache.path.empty());
  EXPECT_EQ(d.cache.reused, g_comm->rank() != 0) << "rank " << g_comm->rank();
  // The same file on every rank, one file in the folder.
  char path[512] = {};
  if (g_comm->rank() == 0) std::snprintf(path, sizeof path, "%s", d.cache.path.c_str());
  g_comm->broadcast(path, sizeof path, 0);
  EXPECT_EQ(d.cache.path, std::string(path));
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.path().extension() == ".qlora-data";
  EXPECT_EQ(files, 1u);
  // The same rows on every rank.
  uint64_t mine = fingerprint(d), root = mine;
  g_comm->broadcast(&root, sizeof root, 0);
  EXPECT_EQ(mine, root);
  EXPECT_GT(d.train.size(), 0u);
  EXPECT_EQ(d.eval.size() > 0, true);
  g_comm->barrier();
  if (g_comm->rank() == 0) std::filesystem::remove_all(dir);
}

TEST(DataCacheRanks, RankZerosDataErrorStopsEveryRank) {
  const std::string dir = shared_dir("error");
  const ModelSource src = open_model_source(kFx + "/models/pref_tiny");
  const TrainConfig cfg = config(dir, dir + "/missing.jsonl");
  try {
    load_train_data(cfg, src, [](const std::string&) {}, g_comm);
    ADD_FAILURE() << "no error on rank " << g_comm->rank();
  } catch (const Error& e) {
    const std::string what = e.what();
    if (g_comm->rank() == 0) EXPECT_NE(what.find("missing.jsonl"), std::string::npos) << what;
    else EXPECT_NE(what.find("rank 0 could not prepare the training data"), std::string::npos) << what;
  }
  g_comm->barrier();
  if (g_comm->rank() == 0) std::filesystem::remove_all(dir);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = make_comm(120);
  if (comm->size() < 2) {
    std::fprintf(stderr, "test_data_cache_ranks: run under mpirun -np 2 or more (got %d rank)\n", comm->size());
    return 1;
  }
  g_comm = comm.get();
  double failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  comm->allreduce_sum(&failed, 1);
  if (comm->rank() == 0 && failed > 0) std::fprintf(stderr, "test_data_cache_ranks: %d rank(s) failed\n", int(failed));
  return failed > 0 ? 1 : 0;
}
