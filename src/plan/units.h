// Number formatting shared by planner messages and reports (GiB for memory, SI for rates).
#pragma once
#include <cmath>
#include <cstdio>
#include <string>

namespace qlora {

// "131.52 GiB" (binary, like the device capacities), "-3.10 GiB" for deficits, "12.0 MiB" when small.
inline std::string fmt_gib(double bytes) {
  char b[48];
  if (std::fabs(bytes) < double(int64_t(1) << 30) && bytes != 0)
    std::snprintf(b, sizeof b, "%.1f MiB", bytes / double(1 << 20));
  else
    std::snprintf(b, sizeof b, "%.2f GiB", bytes / double(int64_t(1) << 30));
  return b;
}

// 1.23e15 -> "1.23 P" + unit; used for FLOPs and tokens.
inline std::string fmt_si(double x, const char* unit) {
  const char* pre[] = {"", "K", "M", "G", "T", "P", "E"};
  int i = 0;
  while (std::fabs(x) >= 1000 && i < 6) { x /= 1000; i++; }
  char b[48];
  std::snprintf(b, sizeof b, "%.3g %s%s", x, pre[i], unit);
  std::string s = b;
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// 70553706496 -> "70.6B params", 134515008 -> "135M params".
inline std::string fmt_params(double n) {
  char b[48];
  if (n >= 1e9) std::snprintf(b, sizeof b, "%.3gB params", n / 1e9);
  else std::snprintf(b, sizeof b, "%.3gM params", n / 1e6);
  return b;
}

inline std::string fmt_fixed(double x, int digits) {
  char b[48];
  std::snprintf(b, sizeof b, "%.*f", digits, x);
  return b;
}

}  // namespace qlora
