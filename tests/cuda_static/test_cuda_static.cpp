// cuda-static: gates on what nvcc and ptxas produced for every kernel of the CUDA backend, per
// built architecture, read from libqlora_backend_cuda.a with cuobjdump (no GPU needed):
//   Coverage       every object of the library has a cubin (SASS) for the architecture
//   LaunchBounds   every kernel declares __launch_bounds__ (EIATTR_MAX_THREADS in its cubin)
//   RegisterFile   registers x threads at the declared bound fit the register file of one SM
//   NoLocalMemory  no stack frame and no local memory (so no register spills)
//   SharedMemory   static + dynamic shared memory within the architecture's opt-in limit
//   Sass           no local loads/stores (LDL/STL) in any kernel; the flash-attention kernels run
//                  on tensor cores (HMMA) fed by ldmatrix (LDSM)
// cuobjdump (and nvdisasm, which it runs for -sass) come from tests/fetch_cuobjdump.sh, which
// `make test` runs. Overrides: QLORA_CUDA_STATIC_LIB (the archive or object to check),
// QLORA_CUOBJDUMP (the tool), QLORA_CUDA_STATIC_ARCHS ("sm_80 sm_90a", "sm_*" = whatever is there).
#include <cxxabi.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dynamic_smem.h"

namespace {

using qlora::cuda_static::DynamicSmem;

// ---- Limits and declared exceptions -----------------------------------------------------------

constexpr long kRegisterFile = 65536;  // 32-bit registers per SM (and per block), sm_75 .. sm_121
constexpr long kMaxThreadsPerBlock = 1024;

// cudaDevAttrMaxSharedMemoryPerBlockOptin by compute capability (CUDA C++ Programming Guide,
// "Technical Specifications per Compute Capability").
long smem_optin_limit(int cc) {
  switch (cc) {
    case 75: return 64 * 1024;
    case 80: case 87: return 163 * 1024;   // 166912
    case 86: case 89: case 120: case 121: return 99 * 1024;
    case 90: case 100: case 103: case 110: return 227 * 1024;  // 232448
    default: return -1;
  }
}

// Kernels allowed a stack frame / local memory, each with its reason. The match is a substring of
// the demangled name; arch "" means every architecture. Keep this list short and justified; it is
// empty now (rope_kernel no longer calls sincosf on unreduced angles, whose Payne-Hanek path kept
// a table in a 32-byte frame: it reduces in double and takes __sincosf, see cuda_norm.cu).
struct LocalMemoryException {
  const char* kernel;
  const char* arch;
  int max_stack_bytes;  // the frame it is allowed; any LDL/STL then only touch that frame
  const char* reason;
};
constexpr std::array<LocalMemoryException, 0> kLocalMemoryExceptions{};

// Kernels launched with dynamic shared memory, and the most any launch asks for. The attention
// sizes come from their tile traits (dynamic_smem.cu); rope keeps cos/sin of one token, 4 bytes
// per element of head_dim (cuda_norm.cu), checked here for head_dim up to 1024.
std::vector<DynamicSmem> dynamic_smem_table() {
  std::vector<DynamicSmem> t = qlora::cuda_static::attention_dynamic_smem();
  t.push_back({"::rope_kernel(", 1024 * 4});
  return t;
}

// The flash-attention kernels that must use tensor cores; each must be present for every arch.
const std::vector<std::string> kAttentionKernels = {
    "qlora::cuda::attn::attn_fwd_kernel<64>(", "qlora::cuda::attn::attn_fwd_kernel<128>(",
    "qlora::cuda::attn::attn_fwd_kernel<256>(",
    "qlora::cuda::attn::attn_bwd_kernel<64, true, false>(", "qlora::cuda::attn::attn_bwd_kernel<128, true, false>(",
    "qlora::cuda::attn::attn_bwd_kernel<64, false, false>(", "qlora::cuda::attn::attn_bwd_kernel<128, false, false>(",
    "qlora::cuda::attn::attn_bwd_kernel<256, false, false>(",
    "qlora::cuda::attn::attn_bwd_kernel<64, false, true>(", "qlora::cuda::attn::attn_bwd_kernel<128, false, true>(",
    "qlora::cuda::attn::attn_bwd_kernel<256, false, true>(",
    "qlora::cuda::attn::attn_bwd_dq_kernel<64>(", "qlora::cuda::attn::attn_bwd_dq_kernel<128>(",
    "qlora::cuda::attn::attn_bwd_dq_kernel<256>("};

// ---- Configuration ------------------------------------------------------------------------------

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
std::string lib_path() { return env_or("QLORA_CUDA_STATIC_LIB", QLORA_CUDA_STATIC_LIB); }
std::string cuobjdump_path() { return env_or("QLORA_CUOBJDUMP", QLORA_CUOBJDUMP); }

std::vector<std::string> arch_params() {
  std::string s = env_or("QLORA_CUDA_STATIC_ARCHS", QLORA_CUDA_STATIC_ARCHS);
  for (char& c : s)
    if (c == ';' || c == ',') c = ' ';
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string a; in >> a;) out.push_back(a);
  if (out.empty()) out.push_back("sm_*");
  return out;
}

bool arch_matches(const std::string& param, const std::string& arch) { return param == "sm_*" || param == arch; }

// "sm_90a" -> 90
int compute_capability(const std::string& arch) {
  int cc = 0;
  for (size_t i = 3; i < arch.size() && std::isdigit(static_cast<unsigned char>(arch[i])); i++) cc = cc * 10 + (arch[i] - '0');
  return cc;
}

std::string demangle(const std::string& mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : mangled;
  std::free(d);
  return out;
}

// ---- Running cuobjdump ------------------------------------------------------------------------------

struct ToolOutput {
  bool ok = false;
  std::string text;  // stdout + stderr
  std::string why;   // when !ok
};

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

ToolOutput run_cuobjdump(const std::string& args) {
  ToolOutput r;
  const std::string tool = cuobjdump_path(), lib = lib_path();
  if (access(tool.c_str(), X_OK) != 0) {
    r.why = "cuobjdump not found at " + tool + ": run `tests/fetch_cuobjdump.sh " + dir_of(tool) +
            "` (make test does; it needs PyPI), or set QLORA_CUOBJDUMP";
    return r;
  }
  if (access(lib.c_str(), R_OK) != 0) {
    r.why = "the CUDA library " + lib + " does not exist (build qlora_backend_cuda, or fix QLORA_CUDA_STATIC_LIB)";
    return r;
  }
  // cuobjdump -sass runs nvdisasm; fetch_cuobjdump.sh puts it beside cuobjdump.
  setenv("NVDISASM_PATH", dir_of(tool).c_str(), 0);
  const std::string cmd = "'" + tool + "' " + args + " '" + lib + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    r.why = "could not run " + cmd;
    return r;
  }
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.text.append(buf, n);
  const int st = pclose(p);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    r.why = cmd + " failed (status " + std::to_string(st) + "):\n" +
            (r.text.size() > 4000 ? r.text.substr(r.text.size() - 4000) : r.text);
    return r;
  }
  r.ok = true;
  return r;
}

// ---- What cuobjdump says about each kernel ----------------------------------------------------

struct Kernel {
  std::string name;    // demangled
  std::string object;  // archive member
  bool is_kernel = false;  // has a .nv.info.<name> section: a __global__ entry point
  bool has_res = false;
  long regs = 0, stack = 0, shared = 0, local = 0;
  bool has_bounds = false;
  long max_threads = 0;  // product of EIATTR_MAX_THREADS (or EIATTR_REQNTID)
  bool has_sass = false;
  long hmma = 0, ldsm = 0, ldl = 0, stl = 0;
};
// arch -> (object + mangled name) -> kernel
using Kernels = std::map<std::string, std::map<std::string, Kernel>>;

// Walks cuobjdump's listing line by line, keeping the archive member and the architecture that
// the current fatbin entry is for.
struct Cursor {
  std::string object, arch;
  bool header(const std::string& line) {
    if (line.rfind("member ", 0) == 0) {
      std::string m = line.substr(7);
      if (!m.empty() && m.back() == ':') m.pop_back();
      object = m.substr(m.rfind(':') == std::string::npos ? 0 : m.rfind(':') + 1);
      arch.clear();
      return true;
    }
    if (line.rfind("arch = ", 0) == 0) {
      arch = line.substr(7);
      return true;
    }
    return false;
  }
};

Kernel& entry(Kernels& k, const Cursor& c, const std::string& mangled) {
  Kernel& e = k[c.arch][c.object + "\n" + mangled];
  if (e.name.empty()) {
    e.name = demangle(mangled);
    e.object = c.object;
  }
  return e;
}

// cuobjdump -res-usage:  " Function NAME:" then "  REG:n STACK:n SHARED:n LOCAL:n CONSTANT[0]:n ..."
void parse_res_usage(const std::string& text, Kernels& out) {
  std::istringstream in(text);
  Cursor c;
  std::string fn;
  for (std::string line; std::getline(in, line);) {
    if (c.header(line)) continue;
    if (line.rfind(" Function ", 0) == 0 && line.back() == ':') {
      fn = line.substr(10, line.size() - 11);
    } else if (!fn.empty() && line.find("REG:") != std::string::npos) {
      Kernel& k = entry(out, c, fn);
      k.has_res = true;
      std::istringstream f(line);
      for (std::string tok; f >> tok;) {
        const size_t colon = tok.rfind(':');
        if (colon == std::string::npos) continue;
        const std::string key = tok.substr(0, colon);
        const long v = std::strtol(tok.c_str() + colon + 1, nullptr, 10);
        if (key == "REG") k.regs = v;
        else if (key == "STACK") k.stack = v;
        else if (key == "SHARED") k.shared = v;
        else if (key == "LOCAL") k.local = v;
      }
      fn.clear();
    }
  }
}

// cuobjdump -elf: per kernel a ".nv.info.NAME" section of tab-indented "Attribute:"/"Value:" lines.
void parse_elf(const std::string& text, Kernels& out) {
  std::istringstream in(text);
  Cursor c;
  std::string fn, attr;
  for (std::string line; std::getline(in, line);) {
    if (c.header(line)) {
      fn.clear();
      continue;
    }
    if (line.empty() || line[0] != '\t') {
      fn.clear();
      if (line.rfind(".nv.info.", 0) == 0 && line.size() > 9) {
        fn = line.substr(9, line.find_last_not_of(" \r") - 8);
        entry(out, c, fn).is_kernel = true;
      }
      continue;
    }
    if (fn.empty()) continue;
    if (const size_t a = line.find("Attribute:"); a != std::string::npos) {
      std::istringstream f(line.substr(a + 10));
      f >> attr;
    } else if (const size_t v = line.find("Value:"); v != std::string::npos &&
                                                    (attr == "EIATTR_MAX_THREADS" || attr == "EIATTR_REQNTID")) {
      std::istringstream f(line.substr(v + 6));
      long product = 1;
      int n = 0;
      for (std::string tok; f >> tok; n++) product *= std::strtol(tok.c_str(), nullptr, 0);
      Kernel& k = entry(out, c, fn);
      if (n > 0 && (!k.has_bounds || product < k.max_threads)) k.max_threads = product;
      k.has_bounds = k.has_bounds || n > 0;
    }
  }
}

// cuobjdump -sass: "Function : NAME" then instructions "/*0a10*/  @!P0 HMMA.16816.F32.BF16 R4, ... ;"
void parse_sass(const std::string& text, Kernels& out) {
  std::istringstream in(text);
  Cursor c;
  Kernel* k = nullptr;
  for (std::string line; std::getline(in, line);) {
    if (c.header(line)) {
      k = nullptr;
      continue;
    }
    if (const size_t f = line.find("Function : "); f != std::string::npos) {
      std::istringstream s(line.substr(f + 11));
      std::string name;
      s >> name;
      k = &entry(out, c, name);
      k->has_sass = true;
      continue;
    }
    if (!k) continue;
    const size_t open = line.find("/*");
    if (open == std::string::npos || open + 2 >= line.size() || !std::isxdigit(static_cast<unsigned char>(line[open + 2])))
      continue;
    const size_t close = line.find("*/", open);
    if (close == std::string::npos) continue;
    std::istringstream s(line.substr(close + 2));
    std::string op;
    s >> op;
    if (!op.empty() && op[0] == '@') s >> op;  // predicate
    op = op.substr(0, op.find('.'));
    if (op == "HMMA") k->hmma++;
    else if (op == "LDSM") k->ldsm++;
    else if (op == "LDL") k->ldl++;
    else if (op == "STL") k->stl++;
  }
}

// One cuobjdump listing per (kind, arch) per process; each ctest case is its own process.
const Kernels* load(const std::string& param, const std::vector<std::string>& kinds, std::string& why) {
  static std::map<std::string, std::pair<Kernels, std::string>> cache;
  std::string key = param;
  for (const auto& k : kinds) key += " " + k;
  auto it = cache.find(key);
  if (it == cache.end()) {
    Kernels ks;
    std::string err;
    const std::string arch_arg = param == "sm_*" ? "" : " -arch " + param;
    for (const auto& kind : kinds) {
      const ToolOutput o = run_cuobjdump("-" + kind + arch_arg);
      if (!o.ok) {
        err = o.why;
        break;
      }
      if (kind == "res-usage") parse_res_usage(o.text, ks);
      else if (kind == "elf") parse_elf(o.text, ks);
      else if (kind == "sass") parse_sass(o.text, ks);
    }
    it = cache.emplace(key, std::make_pair(std::move(ks), err)).first;
  }
  why = it->second.second;
  return why.empty() ? &it->second.first : nullptr;
}

#define QLORA_LOAD(var, ...)                                            \
  std::string var##_why;                                                \
  const Kernels* var = load(GetParam(), {__VA_ARGS__}, var##_why);      \
  if (!var) FAIL() << var##_why;                                        \
  ASSERT_FALSE(var->empty()) << "cuobjdump found no " << GetParam() << " code in " << lib_path()

const LocalMemoryException* local_memory_exception(const std::string& arch, const Kernel& k) {
  for (const auto& e : kLocalMemoryExceptions)
    if (k.name.find(e.kernel) != std::string::npos && (!*e.arch || arch == e.arch)) return &e;
  return nullptr;
}

std::string where(const std::string& arch, const Kernel& k) { return arch + " " + k.name + " [" + k.object + "]"; }

// ---- The gates --------------------------------------------------------------------------------

class CudaStatic : public testing::TestWithParam<std::string> {};

TEST_P(CudaStatic, Coverage) {
  const ToolOutput o = run_cuobjdump("-lelf");
  if (!o.ok) FAIL() << o.why;
  // "member LIB:obj.o:" then "ELF file    1: stem.sm_80.cubin"
  std::map<std::string, std::set<std::string>> archs_of;
  std::istringstream in(o.text);
  Cursor c;
  for (std::string line; std::getline(in, line);) {
    if (c.header(line)) continue;
    const size_t sm = line.rfind(".sm_"), cubin = line.rfind(".cubin");
    if (line.rfind("ELF file", 0) == 0 && sm != std::string::npos && cubin != std::string::npos && cubin > sm)
      archs_of[c.object].insert(line.substr(sm + 1, cubin - sm - 1));
  }
  ASSERT_FALSE(archs_of.empty()) << lib_path() << " holds no cubin at all";
  bool any = false;
  for (const auto& [obj, archs] : archs_of) {
    bool found = false;
    std::string has;
    for (const auto& a : archs) {
      found = found || arch_matches(GetParam(), a);
      has += " " + a;
    }
    any = any || found;
    EXPECT_TRUE(found || GetParam() == "sm_*") << obj << " has no " << GetParam() << " cubin (it has:" << has << ")";
  }
  EXPECT_TRUE(any) << lib_path() << " holds no " << GetParam() << " cubin";
}

TEST_P(CudaStatic, LaunchBounds) {
  QLORA_LOAD(ks, "elf");
  int kernels = 0;
  std::string missing;
  for (const auto& [arch, byname] : *ks)
    for (const auto& [key, k] : byname) {
      if (!k.is_kernel) continue;
      kernels++;
      if (!k.has_bounds) {
        missing += "\n  " + where(arch, k);
      } else {
        EXPECT_LE(k.max_threads, kMaxThreadsPerBlock)
            << where(arch, k) << ": __launch_bounds__ of " << k.max_threads << " threads > " << kMaxThreadsPerBlock;
      }
    }
  EXPECT_GT(kernels, 0);
  EXPECT_TRUE(missing.empty()) << "kernels without __launch_bounds__ (no EIATTR_MAX_THREADS in the cubin):" << missing;
}

TEST_P(CudaStatic, RegisterFile) {
  QLORA_LOAD(ks, "res-usage", "elf");
  for (const auto& [arch, byname] : *ks)
    for (const auto& [key, k] : byname) {
      if (!k.is_kernel || !k.has_bounds) continue;  // LaunchBounds names the kernels without bounds
      ASSERT_TRUE(k.has_res) << where(arch, k) << ": no resource usage from cuobjdump";
      // Registers are allocated per warp in units of 256: 8 per thread, whole warps.
      const long regs = (k.regs + 7) / 8 * 8, threads = (k.max_threads + 31) / 32 * 32;
      EXPECT_LE(regs * threads, kRegisterFile)
          << where(arch, k) << ": " << k.regs << " registers (" << regs << " allocated) x " << k.max_threads
          << " threads = " << regs * threads << " > register file " << kRegisterFile;
    }
}

TEST_P(CudaStatic, NoLocalMemory) {
  QLORA_LOAD(ks, "res-usage");
  for (const auto& [arch, byname] : *ks)
    for (const auto& [key, k] : byname) {
      if (!k.has_res) continue;
      EXPECT_EQ(k.local, 0) << where(arch, k) << ": " << k.local << " bytes of local memory per thread, limit 0";
      if (const auto* e = local_memory_exception(arch, k)) {
        EXPECT_LE(k.stack, e->max_stack_bytes)
            << where(arch, k) << ": stack frame " << k.stack << " bytes > its exception's " << e->max_stack_bytes
            << " (" << e->reason << ")";
        if (k.stack > 0) std::printf("[ excepted ] %s: stack frame %ld bytes: %s\n", where(arch, k).c_str(), k.stack, e->reason);
      } else {
        EXPECT_EQ(k.stack, 0) << where(arch, k) << ": stack frame " << k.stack
                              << " bytes (spilled registers or a local array), limit 0";
      }
    }
}

TEST_P(CudaStatic, SharedMemory) {
  QLORA_LOAD(ks, "res-usage", "elf");
  const std::vector<DynamicSmem> dyn = dynamic_smem_table();
  for (const auto& [arch, byname] : *ks) {
    const long limit = smem_optin_limit(compute_capability(arch));
    ASSERT_GT(limit, 0) << "no shared-memory opt-in limit known for " << arch << ": add it to smem_optin_limit()";
    for (const auto& [key, k] : byname) {
      if (!k.is_kernel) continue;
      long dynamic = 0;
      for (const auto& d : dyn)
        if (k.name.find(d.kernel) != std::string::npos) dynamic = d.bytes;
      EXPECT_LE(k.shared + dynamic, limit)
          << where(arch, k) << ": shared memory " << k.shared << " static + " << dynamic << " dynamic = "
          << k.shared + dynamic << " bytes > " << arch << " opt-in limit " << limit;
    }
  }
}

TEST_P(CudaStatic, Sass) {
  QLORA_LOAD(ks, "elf", "res-usage", "sass");
  for (const auto& [arch, byname] : *ks) {
    std::set<std::string> seen;
    for (const auto& [key, k] : byname) {
      if (!k.is_kernel) continue;
      EXPECT_TRUE(k.has_sass) << where(arch, k) << ": no SASS from cuobjdump -sass";
      const auto* e = local_memory_exception(arch, k);
      if (!e) {
        EXPECT_EQ(k.ldl + k.stl, 0) << where(arch, k) << ": " << k.ldl << " LDL + " << k.stl
                                    << " STL local-memory instructions, limit 0";
      }
      for (const auto& a : kAttentionKernels) {
        if (k.name.find(a) == std::string::npos) continue;
        seen.insert(a);
        EXPECT_GT(k.hmma, 0) << where(arch, k) << ": no HMMA (tensor-core mma) instruction";
        EXPECT_GT(k.ldsm, 0) << where(arch, k) << ": no LDSM (ldmatrix) instruction";
        std::printf("[ attention ] %s: %ld registers, stack %ld, local %ld, static shared %ld, %ld threads, "
                    "%ld HMMA, %ld LDSM, %ld LDL, %ld STL\n",
                    where(arch, k).c_str(), k.regs, k.stack, k.local, k.shared, k.max_threads, k.hmma, k.ldsm, k.ldl,
                    k.stl);
      }
    }
    for (const auto& a : kAttentionKernels)
      EXPECT_TRUE(seen.count(a)) << arch << ": the library has no kernel " << a << "...)";
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, CudaStatic, testing::ValuesIn(arch_params()),
                         [](const testing::TestParamInfo<std::string>& i) {
                           return i.param == "sm_*" ? std::string("all") : i.param;
                         });

}  // namespace
