// The host harness's NCCL (tests/support/cuda_emu/emu_nccl.cpp) across real ranks (ctest runs this
// under mpirun -np 2 and -np 3): the bootstrap the DeviceReducer uses (rank 0's unique id over
// the MPI Comm), sums in rank order bit for bit on every rank (fp32 and bf16), all-gathers and
// reduce-scatters with uneven and in-place layouts, grouped broadcasts, and the errors NCCL
// documents for misuse.
#include <gtest/gtest.h>
#include <nccl.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/local_device.h"
#include "dist/nccl/nccl_reducer.h"

using namespace qlora;

namespace {

Comm* g_comm = nullptr;
ncclComm_t g_nccl = nullptr;

// Values of mixed sign and magnitude, so that the order of summation changes the rounded result.
float value(int rank, size_t i) {
  uint64_t x = (uint64_t(rank) + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t(i) * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 29;
  const double u = double(x % 2000003) / 2000003.0 - 0.5;
  return float(u * std::pow(10.0, double(x % 7) - 3.0));
}

template <class T>
T* device_copy(const std::vector<T>& h) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, h.size() * sizeof(T)), cudaSuccess);
  cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(p);
}

template <class T>
std::vector<T> host_copy(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

// Every rank's copy of `bytes` equals rank 0's.
void expect_same_on_all_ranks(const void* p, size_t bytes) {
  std::vector<unsigned char> mine(static_cast<const unsigned char*>(p), static_cast<const unsigned char*>(p) + bytes);
  std::vector<unsigned char> root = mine;
  g_comm->broadcast(root.data(), bytes, 0);
  EXPECT_EQ(std::memcmp(mine.data(), root.data(), bytes), 0) << "rank " << g_comm->rank() << " differs from rank 0";
}

}  // namespace

TEST(NcclEmu, AllReduceSumsInRankOrderAndEveryRankGetsTheSameBits) {
  const int w = g_comm->size();
  const size_t n = 1003;
  std::vector<float> h(n);
  for (size_t i = 0; i < n; i++) h[i] = value(g_comm->rank(), i);
  float* d = device_copy(h);
  cudaStream_t s;
  cudaStreamCreate(&s);
  ASSERT_EQ(ncclAllReduce(d, d, n, ncclFloat32, ncclSum, g_nccl, s), ncclSuccess) << ncclGetLastError(g_nccl);
  cudaStreamSynchronize(s);
  const auto got = host_copy(d, n);
  size_t order_matters = 0;
  for (size_t i = 0; i < n; i++) {
    float want = value(0, i);
    for (int q = 1; q < w; q++) want += value(q, i);
    EXPECT_EQ(got[i], want) << "element " << i;
    float reversed = value(w - 1, i);
    for (int q = w - 2; q >= 0; q--) reversed += value(q, i);
    order_matters += reversed != want;
  }
  if (w > 2) {
    EXPECT_GT(order_matters, 0u);  // the data can tell rank order from another order
  }
  expect_same_on_all_ranks(got.data(), n * 4);
  cudaFree(d);
  cudaStreamDestroy(s);
}

TEST(NcclEmu, Bf16AllReduceRoundsEachAddition) {
  const int w = g_comm->size();
  const size_t n = 257;
  std::vector<__nv_bfloat16> h(n);
  for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(value(g_comm->rank(), i));
  __nv_bfloat16* src = device_copy(h);
  void* dst = nullptr;
  cudaMalloc(&dst, n * 2);
  ASSERT_EQ(ncclAllReduce(src, dst, n, ncclBfloat16, ncclSum, g_nccl, nullptr), ncclSuccess) << ncclGetLastError(g_nccl);
  const auto got = host_copy(static_cast<__nv_bfloat16*>(dst), n);
  for (size_t i = 0; i < n; i++) {
    __nv_bfloat16 want = __float2bfloat16(value(0, i));
    for (int q = 1; q < w; q++) want = __float2bfloat16(__bfloat162float(want) + __bfloat162float(__float2bfloat16(value(q, i))));
    EXPECT_EQ(__bfloat162float(got[i]), __bfloat162float(want)) << "element " << i;
  }
  EXPECT_EQ(host_copy(src, n)[3], h[3]);  // out of place: the send buffer is untouched
  cudaFree(src);
  cudaFree(dst);
}

TEST(NcclEmu, AllGatherOutOfPlaceAndInPlace) {
  const int w = g_comm->size(), r = g_comm->rank();
  const size_t count = 37;  // an odd share, as the FSDP blobs' padded shares can be
  std::vector<unsigned char> all(count * size_t(w), 0xEE);
  for (size_t i = 0; i < count; i++) all[size_t(r) * count + i] = static_cast<unsigned char>(r * 50 + i);
  unsigned char* recv = device_copy(all);
  std::vector<unsigned char> share(all.begin() + long(size_t(r) * count), all.begin() + long(size_t(r + 1) * count));
  unsigned char* send = device_copy(share);
  unsigned char* out = device_copy(std::vector<unsigned char>(count * size_t(w), 0));
  ASSERT_EQ(ncclAllGather(send, out, count, ncclUint8, g_nccl, nullptr), ncclSuccess) << ncclGetLastError(g_nccl);
  ASSERT_EQ(ncclAllGather(recv + size_t(r) * count, recv, count, ncclUint8, g_nccl, nullptr), ncclSuccess)
      << ncclGetLastError(g_nccl);
  const auto a = host_copy(out, count * size_t(w)), b = host_copy(recv, count * size_t(w));
  for (int q = 0; q < w; q++)
    for (size_t i = 0; i < count; i++) {
      EXPECT_EQ(a[size_t(q) * count + i], static_cast<unsigned char>(q * 50 + i)) << "rank " << q << " byte " << i;
      EXPECT_EQ(b[size_t(q) * count + i], static_cast<unsigned char>(q * 50 + i)) << "rank " << q << " byte " << i;
    }
  cudaFree(recv);
  cudaFree(send);
  cudaFree(out);
}

TEST(NcclEmu, ReduceScatterLeavesEachRankItsSummedShare) {
  const int w = g_comm->size(), r = g_comm->rank();
  const size_t rc = 11;
  std::vector<float> h(rc * size_t(w));
  for (size_t i = 0; i < h.size(); i++) h[i] = value(r, i);
  float* d = device_copy(h);
  ASSERT_EQ(ncclReduceScatter(d, d + size_t(r) * rc, rc, ncclFloat32, ncclSum, g_nccl, nullptr), ncclSuccess)
      << ncclGetLastError(g_nccl);
  const auto got = host_copy(d, h.size());
  for (size_t i = 0; i < rc; i++) {
    const size_t e = size_t(r) * rc + i;
    float want = value(0, e);
    for (int q = 1; q < w; q++) want += value(q, e);
    EXPECT_EQ(got[e], want) << "element " << e;
  }
  cudaFree(d);
}

TEST(NcclEmu, GroupedBroadcastsRunAtGroupEnd) {
  const int w = g_comm->size(), r = g_comm->rank();
  // Uneven shares: rank q holds q + 3 floats; one broadcast per root, grouped.
  std::vector<size_t> off(size_t(w) + 1, 0);
  for (int q = 0; q < w; q++) off[size_t(q) + 1] = off[size_t(q)] + size_t(q) + 3;
  std::vector<float> h(off.back(), -1.0f);
  for (size_t i = off[size_t(r)]; i < off[size_t(r) + 1]; i++) h[i] = float(100 * r) + float(i);
  float* d = device_copy(h);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int q = 0; q < w; q++)
    ASSERT_EQ(ncclBroadcast(d + off[size_t(q)], d + off[size_t(q)], off[size_t(q) + 1] - off[size_t(q)], ncclFloat32, q, g_nccl, nullptr),
              ncclSuccess);
  // Nothing has moved before the group ends.
  EXPECT_EQ(host_copy(d, off.back())[off[size_t((r + 1) % w)]], -1.0f);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(g_nccl);
  const auto got = host_copy(d, off.back());
  for (int q = 0; q < w; q++)
    for (size_t i = off[size_t(q)]; i < off[size_t(q) + 1]; i++) EXPECT_EQ(got[i], float(100 * q) + float(i)) << "element " << i;
  cudaFree(d);
}

// Misuse NCCL documents as an error is refused before any data moves, on the calling rank alone.
TEST(NcclEmu, MisuseIsAnErrorNamingTheArgument) {
  const int w = g_comm->size(), r = g_comm->rank();
  float* d = device_copy(std::vector<float>(64, 1.0f));
  std::vector<float> host(64, 1.0f);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 64, ncclFloat32, ncclSum, g_nccl, nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(g_nccl)).find("sendbuff (256 bytes) is not inside one device allocation"), std::string::npos)
      << ncclGetLastError(g_nccl);
  EXPECT_EQ(ncclAllReduce(d, d, 65, ncclFloat32, ncclSum, g_nccl, nullptr), ncclInvalidArgument);  // past the allocation
  EXPECT_EQ(ncclAllReduce(d, d, 8, ncclDataType_t(99), ncclSum, g_nccl, nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(g_nccl)).find("invalid datatype 99"), std::string::npos);
  EXPECT_EQ(ncclAllReduce(d, d + 1, 8, ncclFloat32, ncclSum, g_nccl, nullptr), ncclInvalidArgument);  // partial overlap
  EXPECT_EQ(ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, nullptr, nullptr), ncclInvalidArgument);
  // All-gather in place is recvbuff + rank * sendcount, nothing else.
  const size_t c = 64 / size_t(w) / 2;
  EXPECT_EQ(ncclAllGather(d + size_t(r) * c + 1, d, c, ncclFloat32, g_nccl, nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(g_nccl)).find("not recvbuff + rank * sendcount"), std::string::npos);
  EXPECT_EQ(ncclBroadcast(d, d, 8, ncclFloat32, w, g_nccl, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  // A failed call inside a group fails the group and runs none of it.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 64, ncclFloat32, ncclSum, g_nccl, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  ncclResult_t async = ncclInternalError;
  ASSERT_EQ(ncclCommGetAsyncError(g_nccl, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);  // argument errors are synchronous; the communicator still works
  cudaFree(d);
}

// The DeviceReducer the trainer uses (src/dist/nccl/nccl_reducer.cpp), bootstrapped as in
// `qlora train`: rank 0's unique id broadcast over the MPI Comm, one grouped all-reduce.
TEST(NcclEmu, DeviceReducerSumsSeveralBuffersInOneGroup) {
  const int w = g_comm->size();
  auto red = make_nccl_reducer(*g_comm, 60);
  std::vector<std::pair<float*, size_t>> bufs;
  for (size_t n : {size_t(5), size_t(300), size_t(1)}) {
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) h[i] = value(g_comm->rank(), i + 7 * n);
    bufs.push_back({device_copy(h), n});
  }
  red->allreduce_sum(bufs);
  for (const auto& [p, n] : bufs) {
    const auto got = host_copy(p, n);
    for (size_t i = 0; i < n; i++) {
      float want = value(0, i + 7 * n);
      for (int q = 1; q < w; q++) want += value(q, i + 7 * n);
      EXPECT_EQ(got[i], want);
    }
    cudaFree(p);
  }
}

// Ranks that disagree on the collective fail with ncclInvalidUsage on every rank (real NCCL would
// hang or corrupt memory): the harness catches a schedule that diverges across ranks.
TEST(NcclEmu, RanksCallingDifferentCollectivesIsInvalidUsage) {
  float* d = device_copy(std::vector<float>(16, 1.0f));
  const size_t n = g_comm->rank() == 0 ? 8 : 16 / size_t(g_comm->size());
  const ncclResult_t r = g_comm->rank() == 0 ? ncclAllReduce(d, d, n, ncclFloat32, ncclSum, g_nccl, nullptr)
                                             : ncclAllGather(d + size_t(g_comm->rank()) * n, d, n, ncclFloat32, g_nccl, nullptr);
  EXPECT_EQ(r, ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(g_nccl)).find("every rank must call the same collectives in the same order"), std::string::npos)
      << ncclGetLastError(g_nccl);
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(g_nccl, &async);
  EXPECT_EQ(async, ncclInvalidUsage);
  cudaFree(d);
}

// Two ranks on one device are refused at init, as NCCL refuses them ("Duplicate GPU detected").
TEST(NcclEmu, InitRefusesTwoRanksOnOneDevice) {
  const char* saved = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string keep = saved ? saved : "";
  setenv("CUDA_VISIBLE_DEVICES", "0", 1);  // every rank on device 0 of this host
  ncclUniqueId id{};
  if (g_comm->rank() == 0) {
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  g_comm->broadcast(&id, sizeof id, 0);
  ncclComm_t c = nullptr;
  EXPECT_EQ(ncclCommInitRank(&c, g_comm->size(), id, g_comm->rank()), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("Duplicate GPU detected"), std::string::npos) << ncclGetLastError(nullptr);
  EXPECT_EQ(c, nullptr);
  if (saved) setenv("CUDA_VISIBLE_DEVICES", keep.c_str(), 1); else unsetenv("CUDA_VISIBLE_DEVICES");
  // An id not made by ncclGetUniqueId (not broadcast) is refused without a collective.
  ncclUniqueId zero{};
  EXPECT_EQ(ncclCommInitRank(&c, g_comm->size(), zero, g_comm->rank()), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&c, g_comm->size(), id, g_comm->size()), ncclInvalidArgument);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = make_comm(60);
  if (comm->size() < 2) {
    std::fprintf(stderr, "test_nccl_emu_ranks: run under mpirun -np 2 or more (got %d rank)\n", comm->size());
    return 1;
  }
  g_comm = comm.get();
  bind_local_gpu(comm->local_rank(), comm->local_size());  // one emulated device per local rank, as qlora train
  ncclUniqueId id{};
  if (comm->rank() == 0) ncclGetUniqueId(&id);
  comm->broadcast(&id, sizeof id, 0);
  if (ncclCommInitRank(&g_nccl, comm->size(), id, comm->rank()) != ncclSuccess) {
    std::fprintf(stderr, "test_nccl_emu_ranks: ncclCommInitRank: %s\n", ncclGetLastError(nullptr));
    return 1;
  }
  double failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  ncclCommDestroy(g_nccl);
  comm->allreduce_sum(&failed, 1);
  if (comm->rank() == 0 && failed > 0) std::fprintf(stderr, "test_nccl_emu_ranks: %d rank(s) failed\n", int(failed));
  return failed > 0 ? 1 : 0;
}
