// NCCL for the host harness, by NCCL's documented semantics, on top of MPI: the communicator is an
// MPI communicator of the ranks that passed the same ncclUniqueId, and each collective moves the
// emulated device buffers (host memory) with MPI. Only the calls the project makes: unique id,
// init/destroy/abort, all-reduce (sum; fp32, bf16), all-gather, reduce-scatter, broadcast, groups,
// asynchronous error and error strings.
//
// Stream order: the harness executes work when it is enqueued (emu_runtime.cpp), so a collective
// runs when it is called, or at ncclGroupEnd for the calls of a group (NCCL launches a group's
// operations together at its end). Every rank must call the same collectives in the same order:
// the harness checks that (kind, count, datatype, op, root) agree on all ranks before moving data,
// and fails with ncclInvalidUsage where real NCCL would hang or corrupt memory.
//
// Sums: every rank adds the ranks' contributions in rank order 0..N-1 (fp32: in float; bf16: in
// float, rounded to bf16 after each addition, as a ring's hops store partial sums in the buffer's
// type), so all ranks get the same bits, the same run to run, as NCCL's ring and tree all-reduces
// give (each element computed once and passed on).
//
// Devices: each process has one emulated device, device 0. Its identity is this host and the
// CUDA_VISIBLE_DEVICES entry the process runs on (or "0" when it is unset); ncclCommInitRank
// refuses two ranks on one device, as NCCL does ("Duplicate GPU detected"), which checks that the
// launcher bound one device per local rank (src/dist/local_device.cpp).
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>

#include "cuda_emu/emu_runtime.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, nranks = 1;
  ncclResult_t async = ncclSuccess;
};

namespace {

thread_local std::string g_last_error;
thread_local int g_group_depth = 0;
thread_local std::vector<std::function<ncclResult_t()>> g_group_ops;
thread_local ncclResult_t g_group_error = ncclSuccess;

ncclResult_t error(ncclResult_t r, const std::string& what) {
  g_last_error = what;
  if (const char* d = std::getenv("NCCL_DEBUG"); d && (std::strcmp(d, "WARN") == 0 || std::strcmp(d, "INFO") == 0))
    std::fprintf(stderr, "NCCL WARN %s\n", what.c_str());
  return r;
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

bool mpi_up() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

// The arguments NCCL documents for every collective: a live communicator, a known datatype, and
// (count > 0) buffers in device memory of the stated size.
ncclResult_t check_common(const char* fn, ncclComm_t comm, ncclDataType_t t) {
  if (!comm) return error(ncclInvalidArgument, std::string(fn) + ": comm is NULL");
  if (!mpi_up()) return error(ncclSystemError, std::string(fn) + ": the harness's MPI has been finalized");
  if (type_size(t) == 0) return error(ncclInvalidArgument, std::string(fn) + ": invalid datatype " + std::to_string(int(t)));
  return ncclSuccess;
}

ncclResult_t check_buffer(const char* fn, const char* name, const void* p, size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  if (!p) return error(ncclInvalidArgument, std::string(fn) + ": " + name + " is NULL");
  if (!qlora::emu::is_device_range(p, bytes))
    return error(ncclInvalidArgument, std::string(fn) + ": " + name + " (" + std::to_string(bytes) +
                                          " bytes) is not inside one device allocation");
  return ncclSuccess;
}

bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  const auto *pa = static_cast<const char*>(a), *pb = static_cast<const char*>(b);
  return na && nb && pa < pb + nb && pb < pa + na;
}

// Every rank must issue the same collective: kind, count, datatype, op and root agree.
struct OpKey {
  int64_t kind, count, dtype, op, root;
  bool operator==(const OpKey&) const = default;
};
const char* const kKinds[] = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast"};

ncclResult_t agree(ncclComm_t comm, const OpKey& mine) {
  std::vector<OpKey> all(size_t(comm->nranks));
  if (MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, comm->mpi) != MPI_SUCCESS)
    return comm->async = error(ncclSystemError, "MPI_Allgather failed");
  for (int q = 0; q < comm->nranks; q++) {
    const OpKey& o = all[size_t(q)];
    if (o == mine) continue;
    return comm->async = error(ncclInvalidUsage,
        std::string(kKinds[mine.kind]) + " on rank " + std::to_string(comm->rank) + " (count " + std::to_string(mine.count) +
        ", datatype " + std::to_string(mine.dtype) + ", root " + std::to_string(mine.root) + ") meets " + kKinds[o.kind] +
        " on rank " + std::to_string(q) + " (count " + std::to_string(o.count) + ", datatype " + std::to_string(o.dtype) +
        ", root " + std::to_string(o.root) + "): every rank must call the same collectives in the same order");
  }
  return ncclSuccess;
}

// All ranks' `bytes` from `send`, rank by rank, into out (nranks x bytes).
ncclResult_t gather_all(ncclComm_t comm, const void* send, size_t bytes, std::vector<unsigned char>& out) {
  if (bytes > size_t(INT32_MAX)) return comm->async = error(ncclInternalError, "harness limit: one rank's share above 2 GiB");
  out.resize(bytes * size_t(comm->nranks));
  std::vector<unsigned char> mine(static_cast<const unsigned char*>(send), static_cast<const unsigned char*>(send) + bytes);
  if (MPI_Allgather(mine.data(), int(bytes), MPI_BYTE, out.data(), int(bytes), MPI_BYTE, comm->mpi) != MPI_SUCCESS)
    return comm->async = error(ncclSystemError, "MPI_Allgather failed");
  return ncclSuccess;
}

// dst[i] = sum over ranks q of all[q][first + i], in rank order.
void sum_ranks(const std::vector<unsigned char>& all, size_t per_rank, int nranks, ncclDataType_t t, size_t first, size_t n,
               void* dst) {
  if (t == ncclFloat32) {
    for (size_t i = 0; i < n; i++) {
      float s = 0;
      std::memcpy(&s, all.data() + (first + i) * 4, 4);
      for (int q = 1; q < nranks; q++) {
        float v;
        std::memcpy(&v, all.data() + size_t(q) * per_rank * 4 + (first + i) * 4, 4);
        s += v;
      }
      std::memcpy(static_cast<char*>(dst) + i * 4, &s, 4);
    }
  } else {  // ncclBfloat16
    for (size_t i = 0; i < n; i++) {
      __nv_bfloat16 s;
      std::memcpy(&s, all.data() + (first + i) * 2, 2);
      for (int q = 1; q < nranks; q++) {
        __nv_bfloat16 v;
        std::memcpy(&v, all.data() + size_t(q) * per_rank * 2 + (first + i) * 2, 2);
        s = __float2bfloat16(__bfloat162float(s) + __bfloat162float(v));
      }
      std::memcpy(static_cast<char*>(dst) + i * 2, &s, 2);
    }
  }
}

ncclResult_t check_reduction(const char* fn, ncclDataType_t t, ncclRedOp_t op) {
  if (int(op) < 0 || int(op) >= int(ncclNumOps)) return error(ncclInvalidArgument, std::string(fn) + ": invalid reduction op " + std::to_string(int(op)));
  if (op != ncclSum) return error(ncclInvalidArgument, std::string(fn) + ": the host harness implements ncclSum only");
  if (t != ncclFloat32 && t != ncclBfloat16)
    return error(ncclInvalidArgument, std::string(fn) + ": the host harness sums ncclFloat32 and ncclBfloat16 only");
  return ncclSuccess;
}

// Runs now, or at the end of the enclosing group, after the earlier work of its stream (the
// harness runs a collective at the call, in stream order: emu_runtime.h).
ncclResult_t enqueue(cudaStream_t stream, std::function<ncclResult_t()> op) {
  auto on_stream = [stream, op = std::move(op)]() -> ncclResult_t {
    qlora::emu::drain_stream(stream);
    qlora::emu::DeviceAccess device_work;
    return op();
  };
  if (g_group_depth > 0) {
    g_group_ops.push_back(std::move(on_stream));
    return ncclSuccess;
  }
  return on_stream();
}

ncclResult_t in_group_error(ncclResult_t r) {
  if (r != ncclSuccess && g_group_depth > 0 && g_group_error == ncclSuccess) g_group_error = r;
  return r;
}

std::string device_identity() {
  char host[128] = {};
  gethostname(host, sizeof host - 1);
  int dev = 0;
  cudaGetDevice(&dev);
  std::string id = std::to_string(dev);
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
    std::vector<std::string> list(1);
    for (const char* p = v; *p; p++) {
      if (*p == ',') list.emplace_back();
      else list.back() += *p;
    }
    if (size_t(dev) < list.size()) id = list[size_t(dev)];
  }
  return std::string(host) + ":" + id;
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return g_last_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return error(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  std::random_device rd;
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, 32, "qlora-emu-nccl %d", int(getpid()));
  for (size_t i = 32; i + 4 <= sizeof id->internal; i += 4) {
    const unsigned v = rd();
    std::memcpy(id->internal + i, &v, 4);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (!out) return error(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *out = nullptr;
  if (nranks < 1) return error(ncclInvalidArgument, "ncclCommInitRank: nranks " + std::to_string(nranks) + " < 1");
  if (rank < 0 || rank >= nranks)
    return error(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " outside [0, " + std::to_string(nranks) + ")");
  if (std::strncmp(id.internal, "qlora-emu-nccl ", 15) != 0)
    return error(ncclInvalidArgument, "ncclCommInitRank: the unique id was not made by ncclGetUniqueId (was it broadcast from the root?)");
  if (!mpi_up())
    return error(ncclSystemError, "ncclCommInitRank: the host harness's NCCL runs over MPI, which is not initialized (start the ranks with mpirun)");
  // The ranks that hold the same id form the communicator (MPI_Comm_split is collective over
  // MPI_COMM_WORLD, as every rank of the job joins here).
  uint32_t h = 2166136261u;
  for (unsigned char c : id.internal) h = (h ^ c) * 16777619u;
  auto* comm = new ncclComm;
  comm->rank = rank;
  comm->nranks = nranks;
  if (MPI_Comm_split(MPI_COMM_WORLD, int(h & 0x7fffffff), rank, &comm->mpi) != MPI_SUCCESS) {
    delete comm;
    return error(ncclSystemError, "ncclCommInitRank: MPI_Comm_split failed");
  }
  int size = 0;
  MPI_Comm_size(comm->mpi, &size);
  struct Member {
    int rank;
    char device[124];
  } me{rank, {}};
  const std::string dev = device_identity();
  std::snprintf(me.device, sizeof me.device, "%s", dev.c_str());
  std::vector<Member> all(static_cast<size_t>(size));
  MPI_Allgather(&me, int(sizeof me), MPI_BYTE, all.data(), int(sizeof me), MPI_BYTE, comm->mpi);
  ncclResult_t r = ncclSuccess;
  if (size != nranks) {
    r = error(ncclInvalidUsage, "ncclCommInitRank: " + std::to_string(size) + " ranks joined with this unique id, nranks is " + std::to_string(nranks));
  } else {
    for (int a = 0; a < size && r == ncclSuccess; a++)
      for (int b = a + 1; b < size && r == ncclSuccess; b++) {
        if (all[size_t(a)].rank == all[size_t(b)].rank)
          r = error(ncclInvalidUsage, "ncclCommInitRank: two ranks joined as rank " + std::to_string(all[size_t(a)].rank));
        else if (std::strcmp(all[size_t(a)].device, all[size_t(b)].device) == 0)
          r = error(ncclInvalidUsage, "Duplicate GPU detected : rank " + std::to_string(all[size_t(a)].rank) + " and rank " +
                                          std::to_string(all[size_t(b)].rank) + " both on CUDA device " + all[size_t(a)].device);
      }
  }
  if (r != ncclSuccess) {
    MPI_Comm_free(&comm->mpi);
    delete comm;
    return r;
  }
  // Order the MPI communicator by NCCL rank (the split's key), so rank q's data lands in slot q.
  *out = comm;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;  // NCCL returns success for a NULL communicator
  if (mpi_up() && comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

// Abort is local: the others may be gone, so no collective (the MPI communicator is left to MPI).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  if (!comm || !async) return error(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
  *async = comm->async;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return error(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return error(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  if (g_group_depth == 0) g_group_error = ncclSuccess;
  g_group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return error(ncclInvalidUsage, "ncclGroupEnd: not within a group (ncclGroupStart missing)");
  if (--g_group_depth > 0) return ncclSuccess;
  auto ops = std::move(g_group_ops);
  g_group_ops.clear();
  if (g_group_error != ncclSuccess) return g_group_error;  // a call of the group failed: nothing runs
  for (auto& op : ops)
    if (const ncclResult_t r = op(); r != ncclSuccess) return r;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  ncclResult_t r = check_common(fn, comm, t);
  if (r == ncclSuccess) r = check_reduction(fn, t, op);
  const size_t bytes = count * type_size(t);
  if (r == ncclSuccess) r = check_buffer(fn, "sendbuff", sendbuff, bytes);
  if (r == ncclSuccess) r = check_buffer(fn, "recvbuff", recvbuff, bytes);
  if (r == ncclSuccess && sendbuff != recvbuff && overlap(sendbuff, bytes, recvbuff, bytes))
    r = error(ncclInvalidArgument, "ncclAllReduce: sendbuff and recvbuff overlap without being equal (in place means sendbuff == recvbuff)");
  if (r != ncclSuccess) return in_group_error(r);
  return enqueue(stream, [=]() -> ncclResult_t {
    if (ncclResult_t a = agree(comm, {0, int64_t(count), int64_t(t), int64_t(op), -1}); a != ncclSuccess) return a;
    std::vector<unsigned char> all;
    if (ncclResult_t g = gather_all(comm, sendbuff, bytes, all); g != ncclSuccess) return g;
    sum_ranks(all, count, comm->nranks, t, 0, count, recvbuff);
    return ncclSuccess;
  });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclReduceScatter";
  ncclResult_t r = check_common(fn, comm, t);
  if (r == ncclSuccess) r = check_reduction(fn, t, op);
  const size_t es = type_size(t), bytes = recvcount * es;
  if (r == ncclSuccess) r = check_buffer(fn, "sendbuff", sendbuff, bytes * size_t(comm->nranks));
  if (r == ncclSuccess) r = check_buffer(fn, "recvbuff", recvbuff, bytes);
  const void* in_place = r == ncclSuccess ? static_cast<const char*>(sendbuff) + size_t(comm->rank) * bytes : nullptr;
  if (r == ncclSuccess && recvbuff != in_place && overlap(sendbuff, bytes * size_t(comm->nranks), recvbuff, bytes))
    r = error(ncclInvalidArgument, "ncclReduceScatter: recvbuff overlaps sendbuff but is not sendbuff + rank * recvcount (the in-place layout)");
  if (r != ncclSuccess) return in_group_error(r);
  return enqueue(stream, [=]() -> ncclResult_t {
    if (ncclResult_t a = agree(comm, {2, int64_t(recvcount), int64_t(t), int64_t(op), -1}); a != ncclSuccess) return a;
    std::vector<unsigned char> all;
    const size_t n = recvcount * size_t(comm->nranks);
    if (ncclResult_t g = gather_all(comm, sendbuff, n * es, all); g != ncclSuccess) return g;
    sum_ranks(all, n, comm->nranks, t, size_t(comm->rank) * recvcount, recvcount, recvbuff);
    return ncclSuccess;
  });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  const char* fn = "ncclAllGather";
  ncclResult_t r = check_common(fn, comm, t);
  const size_t bytes = sendcount * type_size(t);
  if (r == ncclSuccess) r = check_buffer(fn, "sendbuff", sendbuff, bytes);
  if (r == ncclSuccess) r = check_buffer(fn, "recvbuff", recvbuff, bytes * size_t(comm->nranks));
  const void* in_place = r == ncclSuccess ? static_cast<const char*>(recvbuff) + size_t(comm->rank) * bytes : nullptr;
  if (r == ncclSuccess && sendbuff != in_place && overlap(sendbuff, bytes, recvbuff, bytes * size_t(comm->nranks)))
    r = error(ncclInvalidArgument, "ncclAllGather: sendbuff overlaps recvbuff but is not recvbuff + rank * sendcount (the in-place layout)");
  if (r != ncclSuccess) return in_group_error(r);
  return enqueue(stream, [=]() -> ncclResult_t {
    if (ncclResult_t a = agree(comm, {1, int64_t(sendcount), int64_t(t), 0, -1}); a != ncclSuccess) return a;
    std::vector<unsigned char> all;
    if (ncclResult_t g = gather_all(comm, sendbuff, bytes, all); g != ncclSuccess) return g;
    std::memcpy(recvbuff, all.data(), all.size());
    return ncclSuccess;
  });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  const char* fn = "ncclBroadcast";
  ncclResult_t r = check_common(fn, comm, t);
  if (r == ncclSuccess && (root < 0 || root >= comm->nranks))
    r = error(ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root) + " outside [0, " + std::to_string(comm->nranks) + ")");
  const size_t bytes = count * type_size(t);
  if (r == ncclSuccess && comm->rank == root) r = check_buffer(fn, "sendbuff", sendbuff, bytes);
  if (r == ncclSuccess) r = check_buffer(fn, "recvbuff", recvbuff, bytes);
  if (r == ncclSuccess && comm->rank == root && sendbuff != recvbuff && overlap(sendbuff, bytes, recvbuff, bytes))
    r = error(ncclInvalidArgument, "ncclBroadcast: sendbuff and recvbuff overlap without being equal");
  if (r != ncclSuccess) return in_group_error(r);
  return enqueue(stream, [=]() -> ncclResult_t {
    if (ncclResult_t a = agree(comm, {3, int64_t(count), int64_t(t), 0, root}); a != ncclSuccess) return a;
    if (bytes > size_t(INT32_MAX)) return comm->async = error(ncclInternalError, "harness limit: a broadcast above 2 GiB");
    std::vector<unsigned char> buf(bytes);
    if (comm->rank == root && bytes) std::memcpy(buf.data(), sendbuff, bytes);
    if (MPI_Bcast(buf.data(), int(bytes), MPI_BYTE, root, comm->mpi) != MPI_SUCCESS)
      return comm->async = error(ncclSystemError, "MPI_Bcast failed");
    if (bytes) std::memcpy(recvbuff, buf.data(), bytes);
    return ncclSuccess;
  });
}

}  // extern "C"
