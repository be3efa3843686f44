// Fit searches: binary search on monotone memory, and a small grid for the fastest configuration.
#include "plan/fit.h"

#include <algorithm>

#include "plan/units.h"

namespace qlora {

namespace {

bool fits_with(PlanRequest r) { return make_plan(r).fits; }

PlanRequest with_seq(PlanRequest r, int64_t T) {
  r.seq_len = T;
  r.avg_doc_len = std::min(r.avg_doc_len, T);
  return r;
}

// Largest k in [1, limit] with ok(k) true, given ok is monotone (true then false); 0 when ok(1) fails.
template <class F>
int64_t largest_true(int64_t limit, F ok) {
  if (!ok(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= limit && ok(hi)) { lo = hi; hi *= 2; }
  if (hi > limit) {
    if (ok(limit)) return limit;
    hi = limit;
  }
  while (hi - lo > 1) {  // ok(lo) and !ok(hi)
    int64_t mid = lo + (hi - lo) / 2;
    (ok(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::string tok_s(const PlanResult& p) { return fmt_si(p.speed.tokens_per_second, "tok/s"); }

}  // namespace

int64_t max_seq_len_that_fits(const PlanRequest& req, int64_t granularity, int64_t limit) {
  const PlanRequest base = normalize_request(req);
  return granularity * largest_true(limit / granularity, [&](int64_t k) { return fits_with(with_seq(base, k * granularity)); });
}

int64_t max_micro_batch_that_fits(const PlanRequest& req, int64_t limit) {
  const PlanRequest base = normalize_request(req);
  return largest_true(limit, [&](int64_t b) {
    PlanRequest r = base;
    r.micro_batch = b;
    return fits_with(r);
  });
}

FitReport fit_search(const PlanRequest& in) {
  const PlanRequest req = normalize_request(in);
  FitReport rep;
  rep.max_seq_len = max_seq_len_that_fits(req);
  for (Checkpointing ck : checkpointing_modes()) {
    PlanRequest r = req;
    r.checkpointing = ck;
    rep.max_seq_len_by_checkpointing.push_back({ck, r.checkpointing == req.checkpointing ? rep.max_seq_len : max_seq_len_that_fits(r)});
  }
  rep.max_micro_batch = max_micro_batch_that_fits(req);

  // With a batch to split, keep it (same training, different memory/speed trade-off); with the
  // default single sequence there is nothing to split, so let the micro-batch grow instead.
  const int64_t per_gpu_batch = req.micro_batch * req.grad_accum;
  std::vector<int64_t> micro;
  const bool keep_batch = per_gpu_batch > 1;
  if (keep_batch) {
    for (int64_t b = 1; b <= per_gpu_batch; b++)
      if (per_gpu_batch % b == 0) micro.push_back(b);
  }
  std::vector<Sharding> shard = {req.sharding};
  if (req.topo.world() > 1) shard = {Sharding::None, Sharding::Zero1, Sharding::Zero2, Sharding::Zero3};
  rep.space = (keep_batch ? "micro-batch x grad-accum = " + std::to_string(per_gpu_batch) + " sequences"
                          : std::string("micro-batch 1, 2, 4, ... up to the largest that fits (grad-accum 1; give --grad-accum to keep a batch)")) +
              " of " + std::to_string(req.seq_len) + " tokens per GPU; checkpointing none/full/offload" +
              (req.topo.world() > 1 ? "; sharding none/zero1/zero2/zero3" : "");
  for (Sharding s : shard)
    for (Checkpointing ck : checkpointing_modes()) {
      std::vector<int64_t> sizes = micro;
      if (!keep_batch) {  // powers of two below the largest micro-batch that fits, and that one
        PlanRequest r = req;
        r.sharding = s;
        r.checkpointing = ck;
        const int64_t top = max_micro_batch_that_fits(r, 1024);
        for (int64_t b = 1; b < top; b *= 2) sizes.push_back(b);
        sizes.push_back(std::max<int64_t>(top, 1));
      }
      for (int64_t b : sizes) {
        PlanRequest r = req;
        r.sharding = s;
        r.checkpointing = ck;
        r.micro_batch = b;
        r.grad_accum = keep_batch ? per_gpu_batch / b : 1;
        PlanResult p = make_plan(r);
        rep.candidates++;
        if (!p.fits) continue;
        rep.fitting++;
        const bool better = !rep.has_fastest ||
                            p.speed.tokens_per_second > rep.fastest.result.speed.tokens_per_second * (1 + 1e-9) ||
                            (p.speed.tokens_per_second >= rep.fastest.result.speed.tokens_per_second * (1 - 1e-9) &&
                             p.total_bytes < rep.fastest.result.total_bytes);
        if (better) {
          rep.fastest = {p.req, p};
          rep.has_fastest = true;
        }
      }
    }
  return rep;
}

std::vector<std::string> suggest_fixes(const PlanRequest& in) {
  const PlanRequest req = normalize_request(in);
  std::vector<std::string> out;
  auto report = [&](const std::string& change, const PlanRequest& r) {
    PlanResult p = make_plan(r);
    if (p.fits)
      out.push_back(change + ": " + fmt_gib(double(p.total_bytes)) + " per GPU, fits, ~" + tok_s(p) + " (estimate)");
    return p.fits;
  };
  // Checkpointing first: full keeps one input per layer on the device, offload moves all but two
  // of them to pinned host memory (the longest contexts on one GPU).
  bool ckpt_fits = false;
  if (req.checkpointing == Checkpointing::None) {
    PlanRequest r = req;
    r.checkpointing = Checkpointing::Full;
    ckpt_fits = report("--checkpointing full", r);
  }
  if (req.checkpointing != Checkpointing::Offload && !ckpt_fits) {
    PlanRequest r = req;
    r.checkpointing = Checkpointing::Offload;
    report("--checkpointing offload", r);
  }
  if (req.method == Method::Full) {
    PlanRequest r = req;
    r.method = Method::Lora;
    report("--method lora", r);
  }
  if (req.method != Method::Qlora) {
    PlanRequest r = req;
    r.method = Method::Qlora;
    r.base_precision = BasePrecision::Nf4;
    r.double_quant.reset();
    if (!report("--method qlora --base-precision nf4", r) && r.checkpointing == Checkpointing::None) {
      r.checkpointing = Checkpointing::Full;
      report("--method qlora --base-precision nf4 --checkpointing full", r);
    }
  }
  // ZeRO-3 over more GPUs: fill the node first, then add nodes (up to 64 of them).
  std::vector<Topology> topos;
  const int gmax = std::max(req.gpu.max_gpus_per_node, req.topo.gpus_per_node);
  for (int g = req.topo.gpus_per_node; g < gmax; g *= 2) topos.push_back({g, req.topo.nodes});
  for (int n = req.topo.nodes; n <= 64; n *= 2) topos.push_back({gmax, n});
  for (const Topology& t : topos) {
    if (t.world() == 1 || (req.sharding == Sharding::Zero3 && t.world() <= req.topo.world())) continue;
    PlanRequest r = req;
    r.sharding = Sharding::Zero3;
    r.topo = t;
    if (report("--sharding zero3 --gpus-per-node " + std::to_string(t.gpus_per_node) +
                   (t.nodes > 1 ? " --nodes " + std::to_string(t.nodes) : ""), r))
      break;
  }
  if (int64_t T = max_seq_len_that_fits(req); T > 0 && T < req.seq_len)
    out.push_back("--seq-len " + std::to_string(T) + " is the longest that fits as configured");
  else if (T == 0)
    out.push_back("not even 128 tokens fit as configured: the fixed state (weights, optimizer) is too large");
  return out;
}

}  // namespace qlora
