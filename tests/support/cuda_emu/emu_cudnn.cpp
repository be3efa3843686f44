// The host harness's cuDNN SDPA (backend/cuda/cudnn_sdpa_exec.h): building checks the real
// frontend graph with graph.validate(), and executing computes what cuDNN documents for the graph
// the backend built, read from that graph (graph.serialize(): the node's masks, scale and ports,
// every tensor's dims, strides, data type and ragged offset), not from the backend's own shape.
// For each batch entry e, each query head h and each query i < seq_len_q[e] (all s without the
// padding mask): softmax over keys j < seq_len_kv[e] (and j <= i with the causal, top-left
// aligned mask, and j + left_bound > i with a diagonal band's left bound) of scale * q.k, times V;
// Stats = the natural-log log-sum-exp of the scaled scores.
// Element (e, h, i, c) of a tensor sits at ragged_offset[e] (or e * stride[0] without one) +
// h * stride[1] + i * stride[2] + c * stride[3]; query head h reads key/value head h / (hq / hkv)
// (GQA). Each entry's span of each tensor must lie in one device allocation, as the device would
// fault otherwise. The backward computes dQ, dK, dV of the same function from O, dO and Stats.
// Arithmetic in f32 with f64 sums, outputs rounded to bf16 once. Graph features this executor
// does not implement (ALiBi, dropout, a left bound without the causal mask, bottom-right
// alignment, log2 stats, other node kinds or data types) are refused, not approximated.
// Execution runs at the call, after the earlier work of the handle's stream (emu_runtime.h:
// streams are queues).
#include <cuda_bf16.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cudnn_sdpa_exec.h"
#include "cuda_emu/emu_runtime.h"
#include "core/error.h"

namespace qlora::cuda::sdpa {

namespace {

// A live emulated handle: the stream it was made for (each backend has its own).
struct Handle {
  cudaStream_t stream = nullptr;
};
std::set<const Handle*> g_handles;

[[noreturn]] void refuse(const Plan& p, const std::string& why) {
  fail(ErrorKind::Unsupported, "host harness cuDNN, graph " + describe_shape(p.shape), why);
}

// One tensor of the graph as serialized: where element (e, h, i, c) lives.
struct View {
  std::string name;
  int64_t uid = 0;
  std::vector<int64_t> dim, stride;
  int64_t ragged = -1;  // uid of the ragged offset tensor, -1 if none
  std::string dtype;    // the tensor's data type, or the graph's io type where it names none
};

// The SDPA node of a serialized graph: its masks, scale and ports.
struct Node {
  bool backward = false, causal = false, padding = false, stats = false;
  int64_t left_bound = 0;  // > 0: keys j with j + left_bound > i only
  float scale = 0.0f;
  int64_t max_tokens_q = 0;  // max_total_seq_len_q
  std::map<std::string, View> port;  // "Q", "K", "V", "O", "Stats", "SEQ_LEN_Q", ...
  std::map<int64_t, View> by_uid;
};

Node read_graph(const Plan& p) {
  nlohmann::json j;
  p.graph->serialize(j);
  const auto& nodes = j.at("nodes");
  if (nodes.size() != 1) refuse(p, "the harness executes graphs of one SDPA node, this one has " + std::to_string(nodes.size()));
  const auto& n = nodes[0];
  const std::string tag = n.at("tag").get<std::string>();
  if (tag != "SDPA" && tag != "SDPA_BWD") refuse(p, "node " + tag + " is not executed by the harness");
  Node g;
  g.backward = tag == "SDPA_BWD";
  auto flag = [&](const char* key) { return n.contains(key) && n[key].is_boolean() && n[key].get<bool>(); };
  auto set = [&](const char* key) { return n.contains(key) && !n[key].is_null(); };
  if (flag("alibi_mask")) refuse(p, "ALiBi mask");
  if (set("dropout_probability")) refuse(p, "dropout");
  if (set("left_bound")) {
    g.left_bound = n["left_bound"].get<int64_t>();
    if (g.left_bound <= 0) refuse(p, "a left bound of " + std::to_string(g.left_bound));
  }
  if (flag("stats_use_log2")) refuse(p, "log2 stats");
  if (flag("is_mxfp8")) refuse(p, "MXFP8 attention");
  if (set("right_bound")) {
    if (n["right_bound"].get<int64_t>() != 0) refuse(p, "a right bound other than 0");
    if (n.value("diagonal_alignment", std::string("TOP_LEFT")) != "TOP_LEFT") refuse(p, "a bottom-right causal diagonal");
    g.causal = true;
  }
  if (g.left_bound > 0 && !g.causal) refuse(p, "a left bound without the causal mask");
  g.padding = flag("padding_mask");
  if (g.backward && !set("max_total_seq_len_q")) refuse(p, "a backward without max_total_seq_len_q");
  if (set("max_total_seq_len_q")) g.max_tokens_q = n["max_total_seq_len_q"].get<int64_t>();
  g.stats = g.backward || flag("generate_stats");
  // attn_scale_value: the float's bits as hex (the frontend's float serializer).
  if (!set("attn_scale_value")) refuse(p, "no attention scale value (a scale tensor is not executed)");
  const uint32_t bits = uint32_t(std::stoul(n["attn_scale_value"].get<std::string>(), nullptr, 16));
  std::memcpy(&g.scale, &bits, 4);
  const std::string io = j.at("context").at("io_data_type").is_null() ? "" : j["context"]["io_data_type"].get<std::string>();
  for (const auto& t : j.at("tensors")) {
    View v;
    v.name = t.at("name").get<std::string>();
    v.uid = t.at("uid").get<int64_t>();
    v.dim = t.at("dim").get<std::vector<int64_t>>();
    v.stride = t.at("stride").get<std::vector<int64_t>>();
    if (t.contains("ragged_offset_uid") && !t["ragged_offset_uid"].is_null()) v.ragged = t["ragged_offset_uid"].get<int64_t>();
    v.dtype = t.contains("data_type") && !t["data_type"].is_null() ? t["data_type"].get<std::string>() : io;
    g.by_uid[v.uid] = v;
  }
  auto bind = [&](const char* side) {
    for (const auto& [port, uid] : n.at(side).items()) {
      auto it = g.by_uid.find(uid.get<int64_t>());
      if (it == g.by_uid.end()) refuse(p, "port " + port + " names no tensor");
      g.port[port] = it->second;
    }
  };
  bind("inputs");
  bind("outputs");
  static const std::set<std::string> known = {"Q", "K", "V", "O", "Stats", "dO", "dQ", "dK", "dV", "SEQ_LEN_Q", "SEQ_LEN_KV"};
  for (const auto& [port, v] : g.port)
    if (!known.count(port)) refuse(p, "port " + port + " (" + v.name + ") is not executed by the harness");
  return g;
}

const View& port(const Plan& p, const Node& g, const char* name) {
  auto it = g.port.find(name);
  if (it == g.port.end()) refuse(p, std::string("the graph has no ") + name);
  return it->second;
}

void* need(const std::unordered_map<int64_t, void*>& pack, int64_t uid, const Plan& p) {
  auto it = pack.find(uid);
  if (it == pack.end() || !it->second)
    fail(ErrorKind::Internal, "host harness cuDNN, graph " + describe_shape(p.shape),
         "the variant pack has no device pointer for tensor uid " + std::to_string(uid) +
             " (cudnnBackendExecute: CUDNN_STATUS_BAD_PARAM)");
  return it->second;
}

// A bound tensor: its view, device pointer and the ragged offsets (device int32) if it has them.
struct Bound {
  const View* v = nullptr;
  void* ptr = nullptr;
  const int32_t* off = nullptr;
  int64_t base(int64_t e) const { return off ? int64_t(off[e]) : e * v->stride[0]; }
  int64_t at(int64_t e, int64_t h, int64_t i, int64_t c) const {
    return base(e) + h * v->stride[1] + i * v->stride[2] + c * v->stride[3];
  }
};

Bound bind(const Plan& p, const Node& g, std::unordered_map<int64_t, void*>& pack, const char* name, const char* dtype) {
  const View& v = port(p, g, name);
  if (v.dim.size() != 4 || v.stride.size() != 4) refuse(p, std::string(name) + " is not a 4-d tensor");
  if (v.dtype != dtype) refuse(p, std::string(name) + " has data type " + v.dtype + ", the harness executes " + dtype);
  Bound b{&v, need(pack, v.uid, p), nullptr};
  if (v.ragged >= 0) b.off = static_cast<const int32_t*>(need(pack, v.ragged, p));
  return b;
}

// The span entry e of `b` touches for heads [0, h), rows [0, rows) and columns [0, cols) must lie
// in one device allocation.
void check_span(const Plan& p, const Bound& b, int64_t e, int64_t h, int64_t rows, int64_t cols, size_t elem) {
  if (rows == 0) return;
  const int64_t lo = b.base(e), hi = b.at(e, h - 1, rows - 1, cols - 1);
  const auto* c = static_cast<const unsigned char*>(b.ptr);
  if (lo < 0 || hi < lo || !qlora::emu::is_device_range(c + lo * int64_t(elem), size_t(hi - lo + 1) * elem))
    fail(ErrorKind::Internal, "host harness cuDNN, graph " + describe_shape(p.shape),
         b.v->name + " of entry " + std::to_string(e) + " spans elements [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "], outside its device allocation (an illegal address on the device)");
}

float ld(const Bound& b, int64_t i) { return __bfloat162float(static_cast<const __nv_bfloat16*>(b.ptr)[i]); }
void st(const Bound& b, int64_t i, float v) { static_cast<__nv_bfloat16*>(b.ptr)[i] = __float2bfloat16_rn(v); }

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
  // The backward's workspace: an f32 dQ accumulator over the graph's tokens (its
  // max_total_seq_len_q), at dQ's element index, as cuDNN's ragged backward uses one; the forward
  // needs none.
  const Node g = read_graph(p);
  int64_t ws = 0;
  if (g.backward) {
    const View& dq = port(p, g, "dQ");
    ws = g.max_tokens_q * dq.dim[1] * dq.dim[3] * 4;
  }
  p.workspace_bytes = ws;
}

void execute(void* handle, const Plan& p, std::unordered_map<int64_t, void*>& pack, void* workspace) {
  if (!g_handles.count(static_cast<const Handle*>(handle)))
    fail(ErrorKind::Internal, "host harness cuDNN", "execute on an unknown handle");
  qlora::emu::drain_stream(static_cast<const Handle*>(handle)->stream);
  qlora::emu::DeviceAccess device_work;
  const Node g = read_graph(p);
  const char* bf = "BFLOAT16";
  const Bound q = bind(p, g, pack, "Q", bf), k = bind(p, g, pack, "K", bf), v = bind(p, g, pack, "V", bf);
  const Bound o = bind(p, g, pack, "O", bf);
  const int64_t entries = q.v->dim[0], hq = q.v->dim[1], s_q = q.v->dim[2], d = q.v->dim[3];
  const int64_t hkv = k.v->dim[1], s_kv = k.v->dim[2];
  if (hkv <= 0 || hq % hkv || v.v->dim != k.v->dim || o.v->dim != q.v->dim || k.v->dim[3] != d || k.v->dim[0] != entries)
    refuse(p, "Q/K/V/O dims that are not (B, Hq, S, D), (B, Hkv, S, D) with Hq a multiple of Hkv");
  const int64_t group = hq / hkv;
  const int32_t *seq_q = nullptr, *seq_kv = nullptr;
  if (g.padding) {
    seq_q = static_cast<const int32_t*>(need(pack, port(p, g, "SEQ_LEN_Q").uid, p));
    seq_kv = static_cast<const int32_t*>(need(pack, port(p, g, "SEQ_LEN_KV").uid, p));
  }
  Bound stats{};
  if (g.stats) {
    stats = bind(p, g, pack, "Stats", "FLOAT");
    if (stats.v->dim[0] != entries || stats.v->dim[1] != hq || stats.v->dim[2] != s_q || stats.v->dim[3] != 1)
      refuse(p, "Stats dims that are not (B, Hq, S, 1)");
  }
  auto* stp = static_cast<float*>(stats.ptr);
  Bound dout{}, dq{}, dk{}, dv{};
  auto* dq_acc = static_cast<float*>(workspace);
  if (g.backward) {
    dout = bind(p, g, pack, "dO", bf);
    dq = bind(p, g, pack, "dQ", bf);
    dk = bind(p, g, pack, "dK", bf);
    dv = bind(p, g, pack, "dV", bf);
    if (dout.v->dim != q.v->dim || dq.v->dim != q.v->dim || dk.v->dim != k.v->dim || dv.v->dim != k.v->dim)
      refuse(p, "dO/dQ/dK/dV dims unlike Q/K");
    if (!dq_acc) fail(ErrorKind::Internal, "host harness cuDNN", "backward without its workspace");
  }
  std::vector<float> sc, kacc, vacc;
  for (int64_t e = 0; e < entries; e++) {
    const int64_t nq = g.padding ? seq_q[e] : s_q, nk = g.padding ? seq_kv[e] : s_kv;
    if (nq < 0 || nq > s_q || nk < 0 || nk > s_kv)
      fail(ErrorKind::Internal, "host harness cuDNN, graph " + describe_shape(p.shape),
           "entry " + std::to_string(e) + " has seq_len " + std::to_string(nq) + "/" + std::to_string(nk) +
               " outside [0, " + std::to_string(s_q) + "]");
    if (nq == 0) continue;
    check_span(p, q, e, hq, nq, d, 2);
    check_span(p, o, e, hq, nq, d, 2);
    check_span(p, k, e, hkv, nk, d, 2);
    check_span(p, v, e, hkv, nk, d, 2);
    if (g.stats) check_span(p, stats, e, hq, nq, 1, 4);
    if (g.backward) {
      check_span(p, Bound{dq.v, workspace, dq.off}, e, hq, nq, d, 4);  // the accumulator
      check_span(p, dout, e, hq, nq, d, 2);
      check_span(p, dq, e, hq, nq, d, 2);
      check_span(p, dk, e, hkv, nk, d, 2);
      check_span(p, dv, e, hkv, nk, d, 2);
    }
    auto keys = [&](int64_t i) { return g.causal ? std::min(i + 1, nk) : nk; };  // keys query i sees: [first, keys)
    auto first = [&](int64_t i) { return g.left_bound > 0 ? std::max<int64_t>(0, i - g.left_bound + 1) : int64_t(0); };
    auto score = [&](int64_t h, int64_t i, int64_t j) {
      double acc = 0;
      for (int64_t c = 0; c < d; c++) acc += double(ld(q, q.at(e, h, i, c))) * ld(k, k.at(e, h / group, j, c));
      return acc;
    };
    if (!g.backward) {
      for (int64_t h = 0; h < hq; h++)
        for (int64_t i = 0; i < nq; i++) {
          const int64_t j0 = first(i), nj = std::max<int64_t>(0, keys(i) - j0);
          sc.assign(size_t(nj), 0.0f);
          float mx = -INFINITY;
          for (int64_t j = 0; j < nj; j++) {
            sc[size_t(j)] = float(score(h, i, j0 + j)) * g.scale;
            mx = std::max(mx, sc[size_t(j)]);
          }
          double sum = 0;
          for (int64_t j = 0; j < nj; j++) sum += std::exp(double(sc[size_t(j)] - mx));
          for (int64_t c = 0; c < d; c++) {
            double acc = 0;
            for (int64_t j = 0; j < nj; j++)
              acc += std::exp(double(sc[size_t(j)] - mx)) / sum * ld(v, v.at(e, h / group, j0 + j, c));
            st(o, o.at(e, h, i, c), float(acc));
          }
          if (g.stats) stp[stats.at(e, h, i, 0)] = nj > 0 ? mx + float(std::log(sum)) : -INFINITY;
        }
      continue;
    }
    // Backward: P = exp(S - lse), dP = dO V^T, delta = rowsum(dO * O), dS = P (dP - delta);
    // dQ = scale dS K (f32 in the workspace, at dQ's element index), dK = scale dS^T Q and
    // dV = P^T dO summed over the group's query heads.
    auto delta_of = [&](int64_t h, int64_t i) {
      double delta = 0;
      for (int64_t c = 0; c < d; c++) delta += double(ld(dout, dout.at(e, h, i, c))) * ld(o, o.at(e, h, i, c));
      return delta;
    };
    auto dsp = [&](int64_t h, int64_t i, int64_t j, double delta, double& pij) {
      double pdot = 0;
      for (int64_t c = 0; c < d; c++) pdot += double(ld(dout, dout.at(e, h, i, c))) * ld(v, v.at(e, h / group, j, c));
      pij = std::exp(score(h, i, j) * g.scale - stp[stats.at(e, h, i, 0)]);
      return pij * (pdot - delta);
    };
    for (int64_t h = 0; h < hq; h++)
      for (int64_t i = 0; i < nq; i++) {
        const double delta = delta_of(h, i);
        float* acc = dq_acc + dq.at(e, h, i, 0);
        for (int64_t c = 0; c < d; c++) acc[c * dq.v->stride[3]] = 0.0f;
        for (int64_t j = first(i); j < keys(i); j++) {
          double pij;
          const double ds = dsp(h, i, j, delta, pij);
          for (int64_t c = 0; c < d; c++) acc[c * dq.v->stride[3]] += float(g.scale * ds * ld(k, k.at(e, h / group, j, c)));
        }
      }
    for (int64_t hk = 0; hk < hkv; hk++)
      for (int64_t j = 0; j < nk; j++) {
        kacc.assign(size_t(d), 0.0f);
        vacc.assign(size_t(d), 0.0f);
        for (int64_t h = hk * group; h < (hk + 1) * group; h++)
          for (int64_t i = g.causal ? j : 0; i < (g.left_bound > 0 ? std::min(nq, j + g.left_bound) : nq); i++) {
            double pij;
            const double ds = dsp(h, i, j, delta_of(h, i), pij);
            for (int64_t c = 0; c < d; c++) {
              kacc[size_t(c)] += float(g.scale * ds * ld(q, q.at(e, h, i, c)));
              vacc[size_t(c)] += float(pij * ld(dout, dout.at(e, h, i, c)));
            }
          }
        for (int64_t c = 0; c < d; c++) {
          st(dk, dk.at(e, hk, j, c), kacc[size_t(c)]);
          st(dv, dv.at(e, hk, j, c), vacc[size_t(c)]);
        }
      }
    for (int64_t h = 0; h < hq; h++)
      for (int64_t i = 0; i < nq; i++)
        for (int64_t c = 0; c < d; c++) st(dq, dq.at(e, h, i, c), dq_acc[dq.at(e, h, i, c)]);
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
