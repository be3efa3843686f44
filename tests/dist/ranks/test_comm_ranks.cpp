// The MPI Comm across real ranks (ctest runs this under mpirun -np 2 and -np 3): sums are the
// rank-ordered double sums, bit for bit on every rank; shares, gathers and broadcasts move the
// right bytes for uneven splits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "dist/comm.h"

using namespace qlora;

namespace {

Comm* g_comm = nullptr;

// Values of mixed sign and magnitude, so that the order of summation changes the rounded result.
float value(int rank, size_t i) {
  uint64_t x = (uint64_t(rank) + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t(i) * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 29;
  const double u = double(x % 2000003) / 2000003.0 - 0.5;
  return float(u * std::pow(10.0, double(x % 7) - 3.0));
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

}  // namespace

TEST(CommRanks, RankSizeAndLocalRankAreTheLaunchers) {
  EXPECT_EQ(g_comm->size(), env_int("OMPI_COMM_WORLD_SIZE"));
  EXPECT_EQ(g_comm->rank(), env_int("OMPI_COMM_WORLD_RANK"));
  EXPECT_EQ(g_comm->local_rank(), env_int("OMPI_COMM_WORLD_LOCAL_RANK"));
  EXPECT_EQ(g_comm->local_size(), env_int("OMPI_COMM_WORLD_LOCAL_SIZE"));
  EXPECT_NE(g_comm->describe().find(std::to_string(g_comm->size()) + " ranks"), std::string::npos);
}

TEST(CommRanks, FloatSumIsTheRankOrderedDoubleSumOnEveryRank) {
  const int w = g_comm->size();
  for (size_t n : {0u, 1u, 2u, 7u, 1000u, 1001u, 65537u}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = value(g_comm->rank(), i);
    g_comm->allreduce_sum(x.data(), n);
    for (size_t i = 0; i < n; i++) {
      double s = 0;
      for (int q = 0; q < w; q++) s += double(value(q, i));
      ASSERT_EQ(x[i], float(s)) << "n " << n << " element " << i;  // bit-exact: same bits on every rank
    }
  }
}

TEST(CommRanks, DoubleSum) {
  const int w = g_comm->size();
  std::vector<double> x = {double(g_comm->rank()) + 0.25, 1e-17 * (g_comm->rank() + 1), -3.0};
  g_comm->allreduce_sum(x.data(), x.size());
  double s0 = 0, s1 = 0;
  for (int q = 0; q < w; q++) {
    s0 += double(q) + 0.25;
    s1 += 1e-17 * (q + 1);
  }
  EXPECT_EQ(x[0], s0);
  EXPECT_EQ(x[1], s1);
  EXPECT_EQ(x[2], -3.0 * w);
}

TEST(CommRanks, ReduceScatterSumsOnlyMyShare) {
  const int w = g_comm->size(), r = g_comm->rank();
  const size_t n = 10;  // 3 ranks: shares of 3, 3 and 4
  std::vector<float> x(n, float(r + 1));
  g_comm->reduce_scatter_sum(x.data(), n);
  const Slice mine = slice_of(n, r, w);
  for (size_t i = 0; i < n; i++) {
    const bool in = i >= mine.begin && i < mine.end();
    EXPECT_EQ(x[i], in ? float(w * (w + 1) / 2) : float(r + 1)) << i;
  }
}

TEST(CommRanks, AllgatherSlicesAssemblesEveryShare) {
  const int w = g_comm->size(), r = g_comm->rank();
  for (size_t n : {1u, 10u, 4099u}) {
    std::vector<uint8_t> b(n, 0xEE);
    std::vector<float> f(n, -1.f);
    const Slice mine = slice_of(n, r, w);
    for (size_t i = mine.begin; i < mine.end(); i++) {
      b[i] = uint8_t(i * 7 + 3);
      f[i] = float(i) * 0.5f;
    }
    g_comm->allgather_slices(b.data(), n);
    g_comm->allgather_slices(f.data(), n);
    for (size_t i = 0; i < n; i++) {
      ASSERT_EQ(b[i], uint8_t(i * 7 + 3)) << n << " " << i;
      ASSERT_EQ(f[i], float(i) * 0.5f) << n << " " << i;
    }
  }
}

TEST(CommRanks, AllgatherShardsAssemblesTheBlobOutOfPlace) {
  const int w = g_comm->size(), r = g_comm->rank();
  for (size_t n : {1u, 2u, 10u, 4099u}) {  // n < ranks leaves some shares empty; 10 and 4099 split unevenly
    const Slice mine = slice_of(n, r, w);
    std::vector<uint8_t> shard(mine.count), full(n, 0xEE);
    for (size_t i = 0; i < mine.count; i++) shard[i] = uint8_t((mine.begin + i) * 13 + 5);
    g_comm->allgather_shards(shard.data(), full.data(), n);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(full[i], uint8_t(i * 13 + 5)) << n << " " << i;
  }
}

TEST(CommRanks, BlocksOfAnySizeIncludingEmpty) {
  const int w = g_comm->size(), r = g_comm->rank();
  std::vector<size_t> counts(static_cast<size_t>(w));
  for (int q = 0; q < w; q++) counts[size_t(q)] = q == 1 ? 0 : size_t(3 * q + 2);  // rank 1's block is empty
  size_t n = 0, mine = 0;
  for (int q = 0; q < w; q++) {
    if (q < r) mine += counts[size_t(q)];
    n += counts[size_t(q)];
  }
  std::vector<float> x(n);
  for (size_t i = 0; i < n; i++) x[i] = value(r, i);
  g_comm->reduce_scatter_blocks(x.data(), counts);
  for (size_t i = mine; i < mine + counts[size_t(r)]; i++) {
    double s = 0;
    for (int q = 0; q < w; q++) s += double(value(q, i));
    ASSERT_EQ(x[i], float(s)) << i;
  }
  // All-gather: every rank contributes its block, marked with its rank.
  for (size_t i = mine; i < mine + counts[size_t(r)]; i++) x[i] = float(r) + float(i) * 1e-3f;
  g_comm->allgather_blocks(x.data(), counts);
  size_t at = 0;
  for (int q = 0; q < w; q++)
    for (size_t k = 0; k < counts[size_t(q)]; k++, at++) ASSERT_EQ(x[at], float(q) + float(at) * 1e-3f) << at;
}

TEST(CommRanks, BroadcastFromAnyRoot) {
  const int w = g_comm->size();
  for (int root = 0; root < w; root++) {
    int64_t v[2] = {g_comm->rank() == root ? 1000 + root : -1, g_comm->rank()};
    g_comm->broadcast(v, sizeof v, root);
    EXPECT_EQ(v[0], 1000 + root);
    EXPECT_EQ(v[1], root);
  }
  g_comm->barrier();
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = make_comm(60);
  if (comm->size() < 2) {
    std::fprintf(stderr, "test_comm_ranks: run under mpirun -np 2 or more (got %d rank)\n", comm->size());
    return 1;
  }
  g_comm = comm.get();
  double failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  comm->allreduce_sum(&failed, 1);
  if (comm->rank() == 0 && failed > 0) std::fprintf(stderr, "test_comm_ranks: %d rank(s) failed\n", int(failed));
  return failed > 0 ? 1 : 0;
}
