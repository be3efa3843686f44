// attention_fwd / attention_bwd through cuDNN's fused flash attention (SDPA) on sm_90 and sm_100:
// the choice of path, the kernel that turns segment ids into cuDNN's ragged offsets and sequence
// lengths, the graph cache by shape and the variant packs (cudnn_attention.h).
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cudnn_attention.h"
#if QLORA_HAVE_CUDNN
#include "backend/cuda/cudnn_sdpa_exec.h"
#endif

namespace qlora::cuda {

AttnKernel attention_kernel_setting() {
  const char* v = std::getenv("QLORA_ATTENTION_KERNEL");
  const std::string s = v ? v : "";
  if (s.empty() || s == "auto") return AttnKernel::Auto;
  if (s == "cudnn") return AttnKernel::Cudnn;
  if (s == "own") return AttnKernel::Own;
  fail(ErrorKind::Config, "environment variable QLORA_ATTENTION_KERNEL", "unknown value '" + s + "'",
       "use auto, cudnn or own");
}

#if QLORA_HAVE_CUDNN
namespace {

constexpr int kRaggedThreads = 1024;  // sdpa_ragged_kernel's one block

// The cuDNN batch entries of a call, from the segment ids: an entry starts at each row's first
// token and wherever seg changes (seg null: one entry per row). Writes, for `entries` entries,
// int32 arrays one after another in `out`:
//   seq[entries]        tokens of entry e (0 past the last document)
//   off_q[entries+1]    token0(e) * hq * d       (Q, O, dQ, dO)
//   off_kv[entries+1]   token0(e) * hkv * d      (K, V, dK, dV)
//   off_st[entries+1]   row(e) * hq * t + t0(e)  (stats, (B,Hq,T))
// where token0 is the entry's first token in B*T (B*T past the last document). More documents
// than entries is recorded as kErrAttnDocs (the call's result is then wrong; synchronize throws).
__global__ void __launch_bounds__(kRaggedThreads)
    sdpa_ragged_kernel(const int32_t* __restrict__ seg, int64_t b, int64_t t, int entries, int hq, int hkv, int d,
                       int32_t* __restrict__ out, DeviceErrorRecord* err) {
  QLORA_SHARED(int[kRaggedThreads], scan);
  QLORA_SHARED(int, base);
  int32_t* seq = out;
  int32_t* off_q = seq + entries;
  int32_t* off_kv = off_q + entries + 1;
  int32_t* off_st = off_kv + entries + 1;
  const int tid = threadIdx.x;
  const int64_t n = b * t;
  if (tid == 0) base = 0;
  __syncthreads();
  // token0 of each entry goes to off_q first (scaled below).
  for (int64_t c = 0; c < n; c += kRaggedThreads) {
    const int64_t i = c + tid;
    const int flag = i < n && (i % t == 0 || (seg && seg[i] != seg[i - 1])) ? 1 : 0;
    scan[tid] = flag;
    __syncthreads();
    for (int o = 1; o < kRaggedThreads; o <<= 1) {  // inclusive scan of the start flags
      const int add = tid >= o ? scan[tid - o] : 0;
      __syncthreads();
      scan[tid] += add;
      __syncthreads();
    }
    if (flag) {
      const int e = base + scan[tid] - 1;
      if (e < entries) off_q[e] = int32_t(i);
    }
    __syncthreads();
    if (tid == kRaggedThreads - 1) base += scan[tid];
    __syncthreads();
  }
  const int docs = base;
  if (docs > entries && tid == 0) record_device_error(err, kErrAttnDocs, docs, entries);
  const int used = docs < entries ? docs : entries;
  // token0 of every entry (n past the last document) into shared memory, then the scaled offsets.
  QLORA_SHARED(int32_t[cuda_plan::kAttnMaxEntries + 1], tok);
  for (int e = tid; e <= entries; e += kRaggedThreads) tok[e] = e < used ? off_q[e] : int32_t(n);
  __syncthreads();
  for (int e = tid; e <= entries; e += kRaggedThreads) {
    const int64_t t0 = tok[e];
    if (e < entries) seq[e] = tok[e + 1] - int32_t(t0);
    off_q[e] = int32_t(t0 * hq * d);
    off_kv[e] = int32_t(t0 * hkv * d);
    off_st[e] = t0 >= n ? int32_t(n * hq) : int32_t((t0 / t) * hq * t + t0 % t);
  }
}

constexpr int64_t kMaxEntries = cuda_plan::kAttnMaxEntries;
int64_t ragged_bytes(int64_t entries) { return cuda_plan::attention_ragged_bytes(entries); }

}  // namespace
#endif

#if QLORA_HAVE_CUDNN
// One backend's cuDNN state: handle (made on first use) and the built plans by shape.
struct CudnnAttnState {
  int sm = 0;
  void* handle = nullptr;
  std::map<sdpa::Shape, sdpa::Plan> plans;
  std::map<sdpa::Shape, std::string> refused;  // auto mode: shapes cuDNN would not build, and why
  int64_t runs = 0;
  ~CudnnAttnState() { sdpa::destroy_handle(handle); }
};
#else
struct CudnnAttnState {
  int sm = 0;
  int64_t runs = 0;
  std::map<int, int> plans;
};
#endif

struct CudnnAttnAccess {
  static CudnnAttnState& state(CudaBackend& be) {
    if (!be.cudnn_attn_) {
      be.cudnn_attn_ = std::make_shared<CudnnAttnState>();
    }
    return *be.cudnn_attn_;
  }
  static int device(const CudaBackend& be) { return be.device_; }
  static const CudnnAttnState* peek(const CudaBackend& be) { return be.cudnn_attn_.get(); }
  static void reset(CudaBackend& be) noexcept { be.cudnn_attn_.reset(); }
};

std::string cudnn_attention_refusal(Backend& backend, int64_t b, int64_t t, int64_t t_kv, int64_t hq, int64_t d,
                                    bool seg, int64_t n_docs, int64_t window) {
  auto* cu = dynamic_cast<CudaBackend*>(&backend);
  if (!cu) return "not the CUDA backend";
  if (window < 0) return "a negative sliding window";
  CudaBackend& be = *cu;
#if !QLORA_HAVE_CUDNN
  (void)be, (void)b, (void)t, (void)t_kv, (void)hq, (void)d, (void)seg, (void)n_docs, (void)window;
  return "this build has no cuDNN (cmake found no libcudnn, cudnn_graph.h or cuDNN frontend headers)";
#else
  CudnnAttnState& st = CudnnAttnAccess::state(be);
  int major = 0, minor = 0;  // read per call: cheap, and the host harness may change its emulated device
  QLORA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, CudnnAttnAccess::device(be)));
  QLORA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, CudnnAttnAccess::device(be)));
  const int sm = st.sm = major * 10 + minor;
  if (sm / 10 != 9 && sm / 10 != 10)
    return "compute capability " + std::to_string(sm / 10) + "." + std::to_string(sm % 10) +
           " (the cuDNN path runs on sm_90 and sm_100; cuDNN's ragged backward does not run on sm_8x)";
  if (t_kv != 0 && t_kv != t) return "a KV cache (t_kv " + std::to_string(t_kv) + " != t " + std::to_string(t) + ")";
  if (t < 2) return "one-token sequences (cuDNN's backward refuses s_q = s_kv = 1)";
  if (d % 8 != 0 || d > 128) return "head_dim " + std::to_string(d) + " (cuDNN takes multiples of 8 up to 128)";
  const int64_t docs = seg ? n_docs : b;
  if (docs <= 0) return "the number of documents of the packed batch is unknown (AttentionFwdArgs::n_docs is 0)";
  if (sdpa::entries_bucket(docs) > kMaxEntries)
    return std::to_string(docs) + " documents in one call (at most " + std::to_string(kMaxEntries) + ")";
  if (b * t * hq * std::max<int64_t>(d, 1) >= (int64_t(1) << 31))
    return "more than 2^31 elements in q (cuDNN's int32 ragged offsets)";
  return "";
#endif
}

int64_t cudnn_attention_runs(const Backend& be) {
  const auto* cu = dynamic_cast<const CudaBackend*>(&be);
  const CudnnAttnState* s = cu ? CudnnAttnAccess::peek(*cu) : nullptr;
  return s ? s->runs : 0;
}
int64_t cudnn_attention_graphs(const Backend& be) {
  const auto* cu = dynamic_cast<const CudaBackend*>(&be);
  const CudnnAttnState* s = cu ? CudnnAttnAccess::peek(*cu) : nullptr;
  return s ? int64_t(s->plans.size()) : 0;
}
void cudnn_attention_release(CudaBackend& be) noexcept { CudnnAttnAccess::reset(be); }

namespace {

// Whether this call goes to cuDNN: Auto takes it when nothing refuses; Cudnn makes a refusal an
// Unsupported error. A packed call with an unknown document count under Cudnn uses one entry
// per token (correct, slow).
bool take_cudnn(CudaBackend& be, const char* op, int64_t b, int64_t t, int64_t t_kv, int64_t hq, int64_t d,
                const int32_t* seg, int64_t& n_docs, int64_t window) {
  const AttnKernel k = attention_kernel_setting();
  if (k == AttnKernel::Own) return false;
  if (k == AttnKernel::Cudnn && seg && n_docs <= 0) n_docs = b * t;
  const std::string why = cudnn_attention_refusal(be, b, t, t_kv, hq, d, seg != nullptr, n_docs, window);
  if (why.empty()) return true;
  if (k == AttnKernel::Cudnn)
    unsupported(op, "QLORA_ATTENTION_KERNEL=cudnn, but cuDNN's fused attention does not take this call: " + why,
                "unset QLORA_ATTENTION_KERNEL (or set it to auto or own) to use the own kernel");
  return false;
}

#if QLORA_HAVE_CUDNN
struct Ragged {
  int64_t entries;
  int32_t *seq, *off_q, *off_kv, *off_st;
};

Ragged ragged_offsets(CudaBackend& be, const char* op, const int32_t* seg, int64_t b, int64_t t, int64_t hq, int64_t hkv,
                      int64_t d, int64_t entries) {
  Ragged r{};
  r.entries = entries;
  // The own kernel's (B,Hq,T) delta slot, unused by the cuDNN path: planned to hold these too.
  auto* p = static_cast<int32_t*>(be.scratch(Scratch::AttnDelta, size_t(ragged_bytes(r.entries)), op));
  launch(sdpa_ragged_kernel, {1, kRaggedThreads, 0, be.stream()}, seg, b, t, int(r.entries), int(hq), int(hkv), int(d), p,
         be.device_errors());
  QLORA_CUDA_LAUNCH_CHECK();
  r.seq = p;
  r.off_q = p + r.entries;
  r.off_kv = r.off_q + r.entries + 1;
  r.off_st = r.off_kv + r.entries + 1;
  return r;
}

// The built plan for `sh`, or null when cuDNN has none for it and the setting is auto (the caller
// then runs the own kernel; both paths read and write the same (B,Hq,T) lse, so a forward and a
// backward may take different paths). Under QLORA_ATTENTION_KERNEL=cudnn the refusal is thrown.
const sdpa::Plan* plan_for(CudaBackend& be, const sdpa::Shape& sh) {
  CudnnAttnState& s = CudnnAttnAccess::state(be);
  if (auto it = s.plans.find(sh); it != s.plans.end()) return &it->second;
  if (s.refused.count(sh)) return nullptr;
  if (!s.handle) s.handle = sdpa::create_handle(be.stream());
  sdpa::Plan p;
  p.shape = sh;
  p.graph = sdpa::describe(sh, s.sm);
  try {
    sdpa::build(s.handle, p);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Unsupported || attention_kernel_setting() == AttnKernel::Cudnn) throw;
    s.refused.emplace(sh, e.what());
    return nullptr;
  }
  return &s.plans.emplace(sh, std::move(p)).first->second;
}

void* ptr(const Tensor& t) { return t.data; }

// cuDNN's workspace is the own kernel's dq accumulator slot (unused by this path), planned at
// (B,T,Hq,Dp) f32. A plan that asks for more: under auto the shape is refused (the own kernel runs
// it from then on), under QLORA_ATTENTION_KERNEL=cudnn the slot's Internal error (both sizes) stands.
// Returns false when refused.
bool workspace_for(CudaBackend& be, const char* op, const sdpa::Plan& p, void*& ws) {
  ws = nullptr;
  if (p.workspace_bytes == 0) return true;
  try {
    ws = be.scratch(Scratch::AttnDq, size_t(p.workspace_bytes), op);
  } catch (const Error& e) {
    if (attention_kernel_setting() == AttnKernel::Cudnn) throw;
    CudnnAttnAccess::state(be).refused.emplace(p.shape, e.what());
    return false;
  }
  return true;
}

void run(CudaBackend& be, const sdpa::Plan& p, std::unordered_map<int64_t, void*>& pack, void* ws) {
  CudnnAttnState& s = CudnnAttnAccess::state(be);
  sdpa::execute(s.handle, p, pack, ws);
  s.runs++;
}
#endif

}  // namespace

bool cudnn_attention_fwd(CudaBackend& be, const AttentionFwdArgs& a, int64_t t_kv) {
  int64_t docs = a.n_docs;
  if (!take_cudnn(be, "attention_fwd", a.b, a.t, t_kv == a.t ? 0 : t_kv, a.n_head, a.head_dim, a.seg, docs, a.window))
    return false;
#if QLORA_HAVE_CUDNN
  const char* op = "attention_fwd";
  const int64_t entries = sdpa::entries_bucket(a.seg ? docs : a.b);
  sdpa::Shape sh{entries, a.t, a.b * a.t, a.n_head, a.n_head_kv, a.head_dim, a.scale, false, a.window};
  const sdpa::Plan* p = plan_for(be, sh);
  void* ws = nullptr;
  if (!p || !workspace_for(be, op, *p, ws)) return false;
  const Ragged r = ragged_offsets(be, op, a.seg, a.b, a.t, a.n_head, a.n_head_kv, a.head_dim, entries);
  using namespace sdpa;
  std::unordered_map<int64_t, void*> pack{
      {kQ, ptr(a.q)},          {kK, ptr(a.k)},          {kV, ptr(a.v)},          {kO, ptr(a.out)},
      {kStats, ptr(a.lse)},    {kSeqLenQ, r.seq},       {kSeqLenKv, r.seq},      {kOffQ, r.off_q},
      {kOffK, r.off_kv},       {kOffV, r.off_kv},       {kOffO, r.off_q},        {kOffStats, r.off_st}};
  run(be, *p, pack, ws);
  return true;
#else
  return false;
#endif
}

bool cudnn_attention_bwd(CudaBackend& be, const AttentionBwdArgs& a) {
  int64_t docs = a.n_docs;
  if (!take_cudnn(be, "attention_bwd", a.b, a.t, 0, a.n_head, a.head_dim, a.seg, docs, a.window)) return false;
#if QLORA_HAVE_CUDNN
  const char* op = "attention_bwd";
  const int64_t entries = sdpa::entries_bucket(a.seg ? docs : a.b);
  sdpa::Shape sh{entries, a.t, a.b * a.t, a.n_head, a.n_head_kv, a.head_dim, a.scale, true, a.window};
  const sdpa::Plan* p = plan_for(be, sh);
  void* ws = nullptr;
  if (!p || !workspace_for(be, op, *p, ws)) return false;
  const Ragged r = ragged_offsets(be, op, a.seg, a.b, a.t, a.n_head, a.n_head_kv, a.head_dim, entries);
  using namespace sdpa;
  std::unordered_map<int64_t, void*> pack{
      {kQ, ptr(a.q)},       {kK, ptr(a.k)},        {kV, ptr(a.v)},         {kO, ptr(a.out)},     {kdO, ptr(a.dout)},
      {kStats, ptr(a.lse)}, {kdQ, ptr(a.dq)},      {kdK, ptr(a.dk)},       {kdV, ptr(a.dv)},     {kSeqLenQ, r.seq},
      {kSeqLenKv, r.seq},   {kOffQ, r.off_q},      {kOffK, r.off_kv},      {kOffV, r.off_kv},    {kOffO, r.off_q},
      {kOffdO, r.off_q},    {kOffdQ, r.off_q},     {kOffdK, r.off_kv},     {kOffdV, r.off_kv},   {kOffStats, r.off_st}};
  run(be, *p, pack, ws);
  return true;
#else
  return false;
#endif
}

}  // namespace qlora::cuda
