// GPU catalog entries (each figure with its public source) and name / custom-spec resolution.
#include "plan/gpu_catalog.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "core/strings.h"
#include "io/json_util.h"
#include "plan/cpu_device.h"

namespace qlora {

namespace {

constexpr int64_t GiB(double x) { return int64_t(x * double(int64_t(1) << 30)); }
constexpr double GBps(double x) { return x * 1e9; }

// Conventions: peaks are dense (datasheets quote 2:4 sparse figures as 2x; we halve those);
// bf16 is with fp32 accumulate (GeForce parts run that at half the fp16-accumulate rate);
// NVLink/xGMI/scale-up figures are quoted bidirectional by vendors, stored here per direction.
// net_bw is the per-GPU NIC share of the reference node design.
std::vector<GpuSpec> build_catalog() {
  std::vector<GpuSpec> g;
  GpuSpec s;

  // A100 SXM4: NVIDIA A100 Tensor Core GPU datasheet (nvidia.com, "nvidia-a100-datasheet"):
  // 40 GB HBM2 1,555 GB/s / 80 GB HBM2e 2,039 GB/s; BF16 312 TFLOPS dense; NVLink 600 GB/s;
  // PCIe Gen4 x16. DGX A100 datasheet: 8x 200 Gb/s HDR InfiniBand (25 GB/s per GPU).
  s = {};
  s.name = "a100-40gb"; s.display = "NVIDIA A100 SXM4 40GB"; s.aliases = {"a100-40", "a10040gb"};
  s.mem_bytes = GiB(40); s.mem_bw = GBps(1555); s.bf16_tflops = 312;
  s.link_bw = GBps(300); s.net_bw = GBps(25); s.host_bw = GBps(32);
  s.source = "NVIDIA A100 datasheet; DGX A100 datasheet";
  g.push_back(s);
  s.name = "a100-80gb"; s.display = "NVIDIA A100 SXM4 80GB"; s.aliases = {"a100", "a100-80"};
  s.mem_bytes = GiB(80); s.mem_bw = GBps(2039);
  g.push_back(s);

  // H100 SXM5: NVIDIA H100 Tensor Core GPU datasheet: 80 GB HBM3, 3.35 TB/s, BF16 1,979 TFLOPS
  // sparse (989.4 dense), FP8 3,958 sparse (1,978.9 dense), NVLink 900 GB/s, PCIe Gen5 128 GB/s
  // (bidirectional). DGX H100: 8x 400 Gb/s ConnectX-7 (50 GB/s per GPU). perf_anchors.md §8.
  s = {};
  s.name = "h100-sxm"; s.display = "NVIDIA H100 SXM 80GB"; s.aliases = {"h100", "h100-80gb", "h100-sxm5"};
  s.mem_bytes = GiB(80); s.mem_bw = GBps(3350); s.bf16_tflops = 989.4; s.fp8_tflops = 1978.9;
  s.link_bw = GBps(450); s.net_bw = GBps(50); s.host_bw = GBps(64);
  s.source = "NVIDIA H100 datasheet; DGX H100 datasheet";
  g.push_back(s);

  // H100 NVL: same datasheet, NVL column: 94 GB HBM3, 3.9 TB/s, BF16 1,671 sparse (835.5 dense),
  // FP8 3,341 sparse (1,670.5 dense), NVLink bridge 600 GB/s between a pair of cards, PCIe Gen5.
  s = {};
  s.name = "h100-nvl"; s.display = "NVIDIA H100 NVL 94GB"; s.aliases = {"h100nvl", "h100-94gb"};
  s.mem_bytes = GiB(94); s.mem_bw = GBps(3900); s.bf16_tflops = 835.5; s.fp8_tflops = 1670.5;
  s.link_bw = GBps(300); s.net_bw = GBps(50); s.host_bw = GBps(64); s.max_gpus_per_node = 8;
  s.source = "NVIDIA H100 datasheet (NVL column)";
  g.push_back(s);

  // H200 SXM: NVIDIA H200 datasheet / product page: 141 GB HBM3e, 4.8 TB/s, same Hopper tensor
  // peaks as H100 SXM (BF16 989, FP8 1,979 dense), NVLink 900 GB/s. perf_anchors.md §8.
  s = {};
  s.name = "h200"; s.display = "NVIDIA H200 SXM 141GB"; s.aliases = {"h200-sxm", "h200-141gb"};
  s.mem_bytes = GiB(141); s.mem_bw = GBps(4800); s.bf16_tflops = 989.4; s.fp8_tflops = 1978.9;
  s.link_bw = GBps(450); s.net_bw = GBps(50); s.host_bw = GBps(64);
  s.source = "NVIDIA H200 datasheet";
  g.push_back(s);

  // B200: NVIDIA Blackwell launch (GTC 2024): 192 GB HBM3e, 8 TB/s. HGX B200 spec table (8 GPUs):
  // FP4 144 PF sparse / 72 PF dense, FP8 72 PF sparse, BF16 36 PF sparse -> per GPU dense 9 / 4.5 /
  // 2.25 PF; NVLink 5 1.8 TB/s per GPU. The HGX/DGX B200 product ships 180 GB per GPU (DGX B200
  // datasheet: 1,440 GB total). DGX B200: 8x 400 Gb/s ConnectX-7. perf_anchors.md §8.
  s = {};
  s.name = "b200"; s.display = "NVIDIA B200 192GB"; s.aliases = {"b200-192gb", "b200-192"};
  s.mem_bytes = GiB(192); s.mem_bw = GBps(8000); s.bf16_tflops = 2250; s.fp8_tflops = 4500; s.fp4_tflops = 9000;
  s.link_bw = GBps(900); s.net_bw = GBps(50); s.host_bw = GBps(64);
  s.source = "NVIDIA GTC 2024 Blackwell launch; HGX B200 spec table; DGX B200 datasheet"; s.sm100 = true;
  g.push_back(s);
  s.name = "b200-180gb"; s.display = "NVIDIA HGX B200 180GB"; s.aliases = {"hgx-b200", "dgx-b200", "b200-180"};
  s.mem_bytes = GiB(180);
  g.push_back(s);

  // B300 (Blackwell Ultra, HGX): HGX B300 spec table (8 GPUs): FP4 144 PF sparse / 108 PF dense,
  // FP8 72 PF sparse, BF16 36 PF sparse, up to 2.3 TB HBM3e -> per GPU 288 GB, dense FP4 13.5 PF,
  // FP8 4.5, BF16 2.25 PF; 8 TB/s; NVLink 5 1.8 TB/s; ConnectX-8 800 Gb/s per GPU; PCIe Gen6
  // (glennklockwood.com/garden/processors/B300 lists the same HGX rates).
  s = {};
  s.name = "b300"; s.display = "NVIDIA HGX B300 288GB"; s.aliases = {"b300-288gb", "hgx-b300", "dgx-b300"};
  s.mem_bytes = GiB(288); s.mem_bw = GBps(8000); s.bf16_tflops = 2250; s.fp8_tflops = 4500; s.fp4_tflops = 13500;
  s.link_bw = GBps(900); s.net_bw = GBps(100); s.host_bw = GBps(128);
  s.source = "NVIDIA HGX B300 spec table; glennklockwood.com B300 page"; s.sm100 = true;
  g.push_back(s);

  // GB200 (per GPU of an NVL72 rack): GB200 NVL72 spec table: up to 13.4 TB HBM3e / 72 = 186 GB,
  // 576 TB/s / 72 = 8 TB/s, FP4 1,440 PF / FP8 720 PF / BF16 360 PF sparse -> per GPU dense 10 / 5 /
  // 2.5 PF; NVLink 5 1.8 TB/s across 72 GPUs; Grace NVLink-C2C 900 GB/s to host memory.
  s = {};
  s.name = "gb200"; s.display = "NVIDIA GB200 (NVL72) 186GB"; s.aliases = {"gb200-nvl72"};
  s.mem_bytes = GiB(186); s.mem_bw = GBps(8000); s.bf16_tflops = 2500; s.fp8_tflops = 5000; s.fp4_tflops = 10000;
  s.link_bw = GBps(900); s.net_bw = GBps(50); s.host_bw = GBps(450); s.max_gpus_per_node = 72;
  s.source = "NVIDIA GB200 NVL72 spec table; perf_anchors.md §8"; s.sm100 = true;
  g.push_back(s);

  // GB300 (per GPU of an NVL72 rack): GB300 NVL72 spec table: FP4 1,440 PF sparse / 1,080 dense,
  // FP8 720 PF sparse, BF16 360 PF sparse -> per GPU dense 15 / 5 / 2.5 PF; 288 GB HBM3e per
  // Blackwell Ultra GPU (20.7 TB per rack), 8 TB/s; ConnectX-8 800 Gb/s per GPU; NVLink-C2C.
  // verda.com "GB300 NVL72 architecture" lists the same dense rates.
  s = {};
  s.name = "gb300"; s.display = "NVIDIA GB300 (NVL72) 288GB"; s.aliases = {"gb300-nvl72"};
  s.mem_bytes = GiB(288); s.mem_bw = GBps(8000); s.bf16_tflops = 2500; s.fp8_tflops = 5000; s.fp4_tflops = 15000;
  s.link_bw = GBps(900); s.net_bw = GBps(100); s.host_bw = GBps(450); s.max_gpus_per_node = 72;
  s.source = "NVIDIA GB300 NVL72 spec table; verda.com GB300 article"; s.sm100 = true;
  g.push_back(s);

  // RTX 4090: NVIDIA Ada Lovelace architecture whitepaper: 24 GB GDDR6X, 1,008 GB/s; BF16 tensor
  // with FP32 accumulate 165.2 TFLOPS dense, FP8 with FP32 accumulate 330.3 dense; no NVLink,
  // PCIe Gen4 x16 (32 GB/s per direction) also carries GPU-GPU traffic. NIC: assume 100 GbE.
  s = {};
  s.name = "rtx4090"; s.display = "NVIDIA GeForce RTX 4090 24GB"; s.aliases = {"4090", "rtx-4090", "geforce-rtx-4090"};
  s.mem_bytes = GiB(24); s.mem_bw = GBps(1008); s.bf16_tflops = 165.2; s.fp8_tflops = 330.3;
  s.link_bw = GBps(32); s.net_bw = GBps(12.5); s.host_bw = GBps(32);
  s.source = "NVIDIA Ada Lovelace architecture whitepaper";
  g.push_back(s);

  // RTX 5090: NVIDIA RTX Blackwell (GB202) specs: 32 GB GDDR7, 1,792 GB/s; tensor FP16 838 TFLOPS
  // sparse (419 dense, fp16 accumulate), FP8 1,677 sparse, FP4 3,352 "AI TOPS" sparse. With FP32
  // accumulate GeForce runs at half rate -> BF16 209.5, FP8 419, FP4 838 dense (the FP4 halving is
  // our assumption, unverified). PCIe Gen5 x16, no NVLink. NIC: assume 100 GbE.
  s = {};
  s.name = "rtx5090"; s.display = "NVIDIA GeForce RTX 5090 32GB"; s.aliases = {"5090", "rtx-5090", "geforce-rtx-5090"};
  s.mem_bytes = GiB(32); s.mem_bw = GBps(1792); s.bf16_tflops = 209.5; s.fp8_tflops = 419; s.fp4_tflops = 838;
  s.link_bw = GBps(64); s.net_bw = GBps(12.5); s.host_bw = GBps(64);
  s.source = "NVIDIA RTX Blackwell GPU architecture document; spec sheets";
  g.push_back(s);

  // AMD Instinct MI300X: AMD MI300X datasheet: 192 GB HBM3, 5.3 TB/s, BF16 1,307.4 TFLOPS dense,
  // FP8 2,614.9 dense, no FP4; 7 Infinity Fabric links, 896 GB/s aggregate (448 per direction).
  s = {};
  s.name = "mi300x"; s.display = "AMD Instinct MI300X 192GB"; s.aliases = {"amd-mi300x", "instinct-mi300x"};
  s.mem_bytes = GiB(192); s.mem_bw = GBps(5300); s.bf16_tflops = 1307.4; s.fp8_tflops = 2614.9;
  s.link_bw = GBps(448); s.net_bw = GBps(50); s.host_bw = GBps(64); s.has_backend = false;
  s.source = "AMD Instinct MI300X datasheet";
  g.push_back(s);

  // AMD Instinct MI325X: AMD MI325X product page: 256 GB HBM3E, 6 TB/s, same compute as MI300X
  // (BF16 1,307.4, FP8 2,614.9 dense), Infinity Fabric 896 GB/s aggregate.
  s.name = "mi325x"; s.display = "AMD Instinct MI325X 256GB"; s.aliases = {"amd-mi325x", "instinct-mi325x"};
  s.mem_bytes = GiB(256); s.mem_bw = GBps(6000);
  s.source = "AMD Instinct MI325X product page";
  g.push_back(s);

  // Intel Gaudi 3 (OAM): Intel Gaudi 3 AI accelerator white paper / product brief: 128 GB HBM2e,
  // 3.7 TB/s, MME BF16 1,835 TFLOPS and FP8 1,835 TFLOPS (same rate), 24x 200 GbE RoCE on chip;
  // in an 8-card board 21 ports form the all-to-all scale-up (525 GB/s per direction) and 3 go
  // out of the node (75 GB/s).
  s = {};
  s.name = "gaudi3"; s.display = "Intel Gaudi 3 128GB"; s.aliases = {"gaudi-3", "intel-gaudi3", "hl-325l"};
  s.mem_bytes = GiB(128); s.mem_bw = GBps(3700); s.bf16_tflops = 1835; s.fp8_tflops = 1835;
  s.link_bw = GBps(525); s.net_bw = GBps(75); s.host_bw = GBps(64); s.has_backend = false;
  s.source = "Intel Gaudi 3 white paper";
  g.push_back(s);
  return g;
}

std::string normalize(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != '-' && c != '_' && c != ' ') out += char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}


// Parses "<number><unit>" where unit is one of `units` (lower case, with its multiplier).
double parse_quantity(const std::string& key, const std::string& text,
                      const std::vector<std::pair<std::string, double>>& units, const std::string& expect) {
  const std::string where = "--gpu custom: key '" + key + "'";
  std::string v = trim(text);
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || !std::isfinite(x) || x < 0)
    fail(ErrorKind::Config, where, "'" + text + "' is not a non-negative number", "write e.g. " + expect);
  std::string unit;
  for (const char* p = end; *p; ++p)
    if (*p != ' ') unit += char(std::tolower(static_cast<unsigned char>(*p)));
  for (const auto& [u, mult] : units)
    if (unit == u) return x * mult;
  fail(ErrorKind::Config, where, "unknown unit '" + unit + "' in '" + text + "'", "write e.g. " + expect);
}

}  // namespace

double GpuSpec::peak_tflops(GemmDtype gemm_dtype) const {
  switch (gemm_dtype) {
    case GemmDtype::Bf16: return bf16_tflops;
    case GemmDtype::Fp8: return fp8_tflops;
    case GemmDtype::Fp4: return fp4_tflops;
  }
  return 0;
}

const std::vector<GpuSpec>& gpu_catalog() {
  static const std::vector<GpuSpec> c = build_catalog();
  return c;
}

std::vector<std::string> gpu_names() {
  std::vector<std::string> n;
  for (const auto& g : gpu_catalog()) n.push_back(g.name);
  return n;
}

GpuSpec parse_custom_gpu(const std::string& spec) {
  const std::string where = "--gpu " + spec;
  const std::string body = spec.rfind("custom:", 0) == 0 ? spec.substr(7) : spec;
  const std::vector<std::pair<std::string, double>> mem_units = {
      {"gb", 1073741824.0}, {"gib", 1073741824.0}, {"tb", 1099511627776.0}, {"tib", 1099511627776.0},
      {"mb", 1048576.0}, {"mib", 1048576.0}, {"", 1.0}};
  const std::vector<std::pair<std::string, double>> bw_units = {{"gb/s", 1e9}, {"tb/s", 1e12}, {"gbps", 1e9}, {"tbps", 1e12}};
  const std::vector<std::pair<std::string, double>> flop_units = {{"", 1.0}, {"tflops", 1.0}, {"tflop/s", 1.0}};
  GpuSpec g;
  g.name = "custom";
  g.display = "custom GPU";
  g.source = "user-supplied (--gpu custom:...)";
  bool has_mem = false, has_bw = false, has_bf16 = false, has_link = false;
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    std::string item = trim(body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    pos = comma == std::string::npos ? body.size() + 1 : comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos)
      fail(ErrorKind::Config, where, "'" + item + "' is not key=value", "write e.g. custom:mem=80GB,bw=3.35TB/s,bf16=989");
    const std::string key = ascii_lower(trim(item.substr(0, eq))), val = trim(item.substr(eq + 1));
    if (key == "mem") { g.mem_bytes = int64_t(parse_quantity(key, val, mem_units, "mem=80GB")); has_mem = true; }
    else if (key == "bw") { g.mem_bw = parse_quantity(key, val, bw_units, "bw=3.35TB/s"); has_bw = true; }
    else if (key == "bf16") { g.bf16_tflops = parse_quantity(key, val, flop_units, "bf16=989"); has_bf16 = true; }
    else if (key == "fp8") g.fp8_tflops = parse_quantity(key, val, flop_units, "fp8=1979");
    else if (key == "fp4") { g.fp4_tflops = parse_quantity(key, val, flop_units, "fp4=9000"); g.sm100 = true; }
    else if (key == "link") { g.link_bw = parse_quantity(key, val, bw_units, "link=450GB/s"); has_link = true; }
    else if (key == "net") g.net_bw = parse_quantity(key, val, bw_units, "net=50GB/s");
    else if (key == "host") g.host_bw = parse_quantity(key, val, bw_units, "host=64GB/s");
    else if (key == "gpus_per_node") g.max_gpus_per_node = int(parse_quantity(key, val, {{"", 1.0}}, "gpus_per_node=8"));
    else if (key == "name") { g.name = val; g.display = val + " (custom)"; }
    else {
      const std::vector<std::string> keys = {"mem", "bw", "bf16", "fp8", "fp4", "link", "net", "host", "gpus_per_node", "name"};
      std::string close = closest_name(keys, key, 3);
      fail(ErrorKind::Config, where, "unknown key '" + key + "'",
           (close.empty() ? std::string() : "did you mean '" + close + "'? ") +
               "keys: mem, bw, bf16, fp8, fp4, link, net, host, gpus_per_node, name");
    }
  }
  if (!has_mem || !has_bw || !has_bf16)
    fail(ErrorKind::Config, where, std::string("missing required key '") + (!has_mem ? "mem" : !has_bw ? "bw" : "bf16") + "'",
         "custom GPUs need at least mem, bw and bf16, e.g. custom:mem=80GB,bw=3.35TB/s,bf16=989");
  if (g.mem_bytes <= 0 || g.mem_bw <= 0 || g.bf16_tflops <= 0)
    fail(ErrorKind::Config, where, "mem, bw and bf16 must be positive");
  if (!has_link) g.link_bw = GBps(32);  // PCIe-class peer traffic unless told otherwise
  if (g.net_bw == 0) g.net_bw = GBps(12.5);
  if (g.host_bw == 0) g.host_bw = GBps(32);
  if (g.max_gpus_per_node < 1) fail(ErrorKind::Config, where, "gpus_per_node must be >= 1");
  return g;
}

const GpuSpec* gpu_for_device_name(const std::string& device_name, int64_t mem_bytes) {
  const std::string n = normalize(device_name);
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  auto entry = [](const std::string& key) -> const GpuSpec* {
    for (const auto& g : gpu_catalog())
      if (g.name == key) return &g;
    return nullptr;
  };
  const int64_t gib = int64_t(1) << 30;
  // Order matters: "gb200" contains "b200", "h100nvl" contains "h100".
  if (has("gb300")) return entry("gb300");
  if (has("gb200")) return entry("gb200");
  if (has("b300")) return entry("b300");
  if (has("b200")) return entry(mem_bytes > 185 * gib ? "b200" : "b200-180gb");
  if (has("h200")) return has("nvl") ? nullptr : entry("h200");  // H200 NVL has lower clocks
  if (has("h100")) {
    if (has("nvl")) return entry("h100-nvl");
    if (has("pcie")) return nullptr;  // H100 PCIe: 756 TFLOP/s bf16, not catalogued
    return entry("h100-sxm");         // "NVIDIA H100 80GB HBM3" is the SXM part
  }
  if (has("a100")) return entry(mem_bytes > 48 * gib ? "a100-80gb" : "a100-40gb");
  if (has("rtx4090")) return entry("rtx4090");
  if (has("rtx5090")) return entry("rtx5090");
  return nullptr;
}

GpuSpec resolve_gpu(const std::string& name) {
  if (name.rfind("custom:", 0) == 0 || name == "custom") return parse_custom_gpu(name);
  const std::string key = normalize(name);
  if (key == "cpu" || key == "host") return cpu_device_spec(cpu_calibration());
  for (const auto& g : gpu_catalog()) {
    if (normalize(g.name) == key) return g;
    for (const auto& a : g.aliases)
      if (normalize(a) == key) return g;
  }
  std::vector<std::string> cands, owners;
  for (const auto& g : gpu_catalog()) {
    cands.push_back(normalize(g.name)); owners.push_back(g.name);
    for (const auto& a : g.aliases) { cands.push_back(normalize(a)); owners.push_back(g.name); }
  }
  std::string best = closest_name(cands, key, 4);
  std::string hint;
  for (size_t i = 0; i < cands.size() && !best.empty(); i++)
    if (cands[i] == best) { hint = "did you mean '" + owners[i] + "'? "; break; }
  std::string list;
  for (const auto& n : gpu_names()) list += (list.empty() ? "" : ", ") + n;
  fail(ErrorKind::Config, "--gpu " + name, "unknown GPU '" + name + "'",
       hint + "known GPUs: " + list + "; cpu (this machine, calibrated); or describe one with custom:mem=80GB,bw=3.35TB/s,bf16=989,...");
}

}  // namespace qlora
