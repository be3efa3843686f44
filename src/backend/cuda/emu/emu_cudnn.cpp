// The host harness's cuDNN SDPA (backend/cuda/cudnn_sdpa_exec.h): building checks the real
// frontend graph with graph.validate(), and executing computes what cuDNN documents for the
// graph the backend described (cudnn_sdpa_graph.h): for each batch entry e, each head h and each
// query i < seq_len_q[e], softmax over keys j <= i (causal, top-left aligned; j < seq_len_kv[e]
// by the padding mask) of scale * q.k, times V; stats = the natural-log log-sum-exp of the scaled
// scores. Tensors are read at their ragged offsets and strides; query head h reads key/value head
// h / (hq / hkv) (GQA). The backward computes dQ, dK, dV of the same function from O, dO and the
// stats. Arithmetic in f32 with f64 sums, outputs rounded to bf16 once. Execution runs at the call,
// after the earlier work of the handle's stream (emu_runtime.h: streams are queues).
#include <cuda_bf16.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cudnn_sdpa_exec.h"
#include "backend/cuda/emu/emu_runtime.h"
#include "core/error.h"

namespace qlora::cuda::sdpa {

namespace {

// A live emulated handle: the stream it was made for (each backend has its own).
struct Handle {
  cudaStream_t stream = nullptr;
};
std::set<const Handle*> g_handles;

void* need(const std::unordered_map<int64_t, void*>& pack, int64_t uid, const Plan& p) {
  auto it = pack.find(uid);
  if (it == pack.end() || !it->second)
    fail(ErrorKind::Internal, "host harness cuDNN, graph " + describe_shape(p.shape),
         "the variant pack has no device pointer for tensor uid " + std::to_string(uid) +
             " (cudnnBackendExecute: CUDNN_STATUS_BAD_PARAM)");
  return it->second;
}

float ld(const void* p, int64_t i) { return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]); }
void st(void* p, int64_t i, float v) { static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); }

struct Entries {
  const int32_t *seq_q, *seq_kv, *off_q, *off_k, *off_v, *off_o, *off_st;
};

}  // namespace

void* create_handle(cudaStream_t stream) {
  auto* h = new Handle{stream};
  g_handles.insert(h);
  return h;
}

void destroy_handle(void* handle) noexcept {
  if (handle && g_handles.erase(static_cast<const Handle*>(handle))) delete static_cast<Handle*>(handle);
}

void build(void* handle, Plan& p) {
  if (!handle) fail(ErrorKind::Internal, "host harness cuDNN", "build without a handle");
  const std::string err = validate(*p.graph);
  if (!err.empty())
    fail(ErrorKind::Unsupported, "cuda op attention (cuDNN SDPA " + describe_shape(p.shape) + ")", "validate: " + err);
  // The backward's workspace: an f32 dQ accumulator over all tokens, as cuDNN's ragged backward
  // uses one; the forward needs none.
  const Shape& s = p.shape;
  p.workspace_bytes = s.backward ? s.tokens * s.hq * s.d * 4 : 0;
}

void execute(void* handle, const Plan& p, std::unordered_map<int64_t, void*>& pack, void* workspace) {
  if (!g_handles.count(static_cast<const Handle*>(handle)))
    fail(ErrorKind::Internal, "host harness cuDNN", "execute on an unknown handle");
  qlora::emu::drain_stream(static_cast<const Handle*>(handle)->stream);
  const Shape& s = p.shape;
  const int64_t hq = s.hq, hkv = s.hkv, d = s.d, group = hq / hkv;
  // Strides of the (entries, h, s, d) views: token-major (B,T,H,D), and (B,Hq,T) for stats.
  const int64_t q_tok = hq * d, kv_tok = hkv * d, st_h = s.s;
  const auto* seq_q = static_cast<const int32_t*>(need(pack, kSeqLenQ, p));
  const auto* seq_kv = static_cast<const int32_t*>(need(pack, kSeqLenKv, p));
  const auto* off_q = static_cast<const int32_t*>(need(pack, kOffQ, p));
  const auto* off_k = static_cast<const int32_t*>(need(pack, kOffK, p));
  const auto* off_v = static_cast<const int32_t*>(need(pack, kOffV, p));
  const auto* off_o = static_cast<const int32_t*>(need(pack, kOffO, p));
  const auto* off_st = static_cast<const int32_t*>(need(pack, kOffStats, p));
  const void* q = need(pack, kQ, p);
  const void* k = need(pack, kK, p);
  const void* v = need(pack, kV, p);
  void* o = need(pack, kO, p);
  auto* stats = static_cast<float*>(need(pack, kStats, p));
  const void *dout = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  const int32_t *off_do = nullptr, *off_dq = nullptr, *off_dk = nullptr, *off_dv = nullptr;
  float* dq_acc = static_cast<float*>(workspace);
  if (s.backward) {
    dout = need(pack, kdO, p);
    dq = need(pack, kdQ, p);
    dk = need(pack, kdK, p);
    dv = need(pack, kdV, p);
    off_do = static_cast<const int32_t*>(need(pack, kOffdO, p));
    off_dq = static_cast<const int32_t*>(need(pack, kOffdQ, p));
    off_dk = static_cast<const int32_t*>(need(pack, kOffdK, p));
    off_dv = static_cast<const int32_t*>(need(pack, kOffdV, p));
    if (!dq_acc) fail(ErrorKind::Internal, "host harness cuDNN", "backward without its workspace");
  }
  std::vector<float> sc, pr, dp, kacc, vacc;
  for (int64_t e = 0; e < s.entries; e++) {
    const int64_t nq = seq_q[e], nk = seq_kv[e];
    if (nq < 0 || nq > s.s || nk < 0 || nk > s.s)
      fail(ErrorKind::Internal, "host harness cuDNN, graph " + describe_shape(s),
           "entry " + std::to_string(e) + " has seq_len " + std::to_string(nq) + " outside [0, " + std::to_string(s.s) + "]");
    if (nq == 0) continue;
    for (int64_t h = 0; h < hq; h++) {
      const int64_t hk = h / group;
      const int64_t qb = off_q[e] + h * d, kb = off_k[e] + hk * d, vb = off_v[e] + hk * d, ob = off_o[e] + h * d;
      const int64_t sb = off_st[e] + h * st_h;
      if (!s.backward) {
        for (int64_t i = 0; i < nq; i++) {
          const int64_t nj = std::min(i + 1, nk);
          sc.assign(size_t(nj), 0.0f);
          float mx = -INFINITY;
          for (int64_t j = 0; j < nj; j++) {
            double acc = 0;
            for (int64_t c = 0; c < d; c++) acc += double(ld(q, qb + i * q_tok + c)) * ld(k, kb + j * kv_tok + c);
            sc[size_t(j)] = float(acc) * s.scale;
            mx = std::max(mx, sc[size_t(j)]);
          }
          double sum = 0;
          for (int64_t j = 0; j < nj; j++) sum += std::exp(double(sc[size_t(j)] - mx));
          for (int64_t c = 0; c < d; c++) {
            double acc = 0;
            for (int64_t j = 0; j < nj; j++) acc += std::exp(double(sc[size_t(j)] - mx)) / sum * ld(v, vb + j * kv_tok + c);
            st(o, ob + i * q_tok + c, float(acc));
          }
          stats[sb + i] = nj > 0 ? mx + float(std::log(sum)) : -INFINITY;
        }
        continue;
      }
      // Backward: P = exp(S - lse), dP = dO V^T, delta = rowsum(dO * O), dS = P (dP - delta);
      // dQ = scale dS K (f32 in the workspace), dK += scale dS^T Q, dV += P^T dO over the group.
      const int64_t dob = off_do[e] + h * d;
      for (int64_t i = 0; i < nq; i++) {
        const int64_t nj = std::min(i + 1, nk);
        double delta = 0;
        for (int64_t c = 0; c < d; c++) delta += double(ld(dout, dob + i * q_tok + c)) * ld(o, ob + i * q_tok + c);
        float* acc = dq_acc + (off_dq[e] + h * d + i * q_tok);
        for (int64_t c = 0; c < d; c++) acc[c] = 0.0f;
        for (int64_t j = 0; j < nj; j++) {
          double sdot = 0, pdot = 0;
          for (int64_t c = 0; c < d; c++) {
            sdot += double(ld(q, qb + i * q_tok + c)) * ld(k, kb + j * kv_tok + c);
            pdot += double(ld(dout, dob + i * q_tok + c)) * ld(v, vb + j * kv_tok + c);
          }
          const double pij = std::exp(sdot * s.scale - stats[sb + i]);
          const double ds = pij * (pdot - delta);
          for (int64_t c = 0; c < d; c++) acc[c] += float(s.scale * ds * ld(k, kb + j * kv_tok + c));
        }
      }
    }
    if (!s.backward) continue;
    // dK, dV per key head: sums over the query heads of its group and the queries that see key j.
    for (int64_t hk = 0; hk < hkv; hk++)
      for (int64_t j = 0; j < nk; j++) {
        kacc.assign(size_t(d), 0.0f);
        vacc.assign(size_t(d), 0.0f);
        const int64_t kb = off_k[e] + hk * d, vb = off_v[e] + hk * d;
        for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
          const int64_t qb = off_q[e] + h * d, ob = off_o[e] + h * d, dob = off_do[e] + h * d;
          const int64_t sb = off_st[e] + h * st_h;
          for (int64_t i = j; i < nq; i++) {
            double sdot = 0, pdot = 0, delta = 0;
            for (int64_t c = 0; c < d; c++) {
              sdot += double(ld(q, qb + i * q_tok + c)) * ld(k, kb + j * kv_tok + c);
              pdot += double(ld(dout, dob + i * q_tok + c)) * ld(v, vb + j * kv_tok + c);
              delta += double(ld(dout, dob + i * q_tok + c)) * ld(o, ob + i * q_tok + c);
            }
            const double pij = std::exp(sdot * s.scale - stats[sb + i]);
            const double ds = pij * (pdot - delta);
            for (int64_t c = 0; c < d; c++) {
              kacc[size_t(c)] += float(s.scale * ds * ld(q, qb + i * q_tok + c));
              vacc[size_t(c)] += float(pij * ld(dout, dob + i * q_tok + c));
            }
          }
        }
        for (int64_t c = 0; c < d; c++) {
          st(dk, off_dk[e] + hk * d + j * kv_tok + c, kacc[size_t(c)]);
          st(dv, off_dv[e] + hk * d + j * kv_tok + c, vacc[size_t(c)]);
        }
      }
    for (int64_t h = 0; h < hq; h++)
      for (int64_t i = 0; i < nq; i++)
        for (int64_t c = 0; c < d; c++) {
          const int64_t at = off_dq[e] + h * d + i * q_tok + c;
          st(dq, at, dq_acc[at]);
        }
  }
}

}  // namespace qlora::cuda::sdpa

// CUDA-graph runtime calls the cuDNN frontend's headers reference (stream-capture guards around
// plan building, graph user objects). The harness never captures a stream: the capture status is
// always none, the thread's capture mode is kept as exchanged, and user objects are not supported.
static thread_local cudaStreamCaptureMode g_capture_mode = cudaStreamCaptureModeGlobal;
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  if (!mode) return cudaErrorInvalidValue;
  std::swap(*mode, g_capture_mode);
  return cudaSuccess;
}
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t, enum cudaStreamCaptureStatus* status, unsigned long long* id,
                                     cudaGraph_t* graph, const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                     size_t* n_deps) {
  if (!status) return cudaErrorInvalidValue;
  *status = cudaStreamCaptureStatusNone;
  if (id) *id = 0;
  if (graph) *graph = nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (n_deps) *n_deps = 0;
  return cudaSuccess;
}
cudaError_t cudaUserObjectCreate(cudaUserObject_t*, void*, cudaHostFn_t, unsigned int, unsigned int) {
  return cudaErrorNotSupported;
}
cudaError_t cudaUserObjectRelease(cudaUserObject_t, unsigned int) { return cudaErrorNotSupported; }
cudaError_t cudaGraphRetainUserObject(cudaGraph_t, cudaUserObject_t, unsigned int, unsigned int) {
  return cudaErrorNotSupported;
}
