// Run-time detection of the CPU flash kernels' instruction-set levels
// (cpu_isa.h). Compiled for baseline x86-64 like the rest of the library.
#include "backends/cpu/cpu_isa.h"

#include <cstdint>
#include <cstdlib>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define ATTNPROF_X86 1
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attnprof::cpu {
namespace {

struct Features {
  bool sse2 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512bf16 = false;
  bool amx_tile = false, amx_bf16 = false;
  bool os_avx = false;         // XCR0 has the SSE and AVX state (XMM, YMM)
  bool os_avx512 = false;      // and the opmask, ZMM_Hi256 and Hi16_ZMM state
  bool os_amx = false;         // and XTILECFG and XTILEDATA
  bool amx_permitted = false;  // Linux granted this process the tile data state
  std::string amx_refusal;     // why not, when the CPU has AMX
};

#if ATTNPROF_X86
std::uint64_t xgetbv0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}
#endif

// Linux keeps the AMX tile data (8 KiB per thread) out of a process's
// signal frames until it asks: without ARCH_REQ_XCOMP_PERM the first tile
// instruction faults. Asked once; the grant covers every thread.
bool request_amx(std::string& why) {
#if defined(__linux__) && ATTNPROF_X86
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return true;
  why = "OS permission for AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM refused)";
  return false;
#else
  why = "OS permission for AMX tile data (not Linux)";
  return false;
#endif
}

Features detect() {
  Features f;
#if ATTNPROF_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  __get_cpuid(1, &a, &b, &c, &d);
  f.sse2 = (d >> 26) & 1;
  f.fma = (c >> 12) & 1;
  const bool osxsave = (c >> 27) & 1;
  f.avx = (c >> 28) & 1;
  f.f16c = (c >> 29) & 1;
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned max_sub = a;
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.amx_bf16 = (d >> 22) & 1;
    f.amx_tile = (d >> 24) & 1;
    if (max_sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      f.avx512bf16 = (a >> 5) & 1;
    }
  }
  if (osxsave) {
    const std::uint64_t xcr0 = xgetbv0();
    f.os_avx = (xcr0 & 0x6) == 0x6;
    f.os_avx512 = f.os_avx && (xcr0 & 0xE0) == 0xE0;
    f.os_amx = (xcr0 & 0x60000) == 0x60000;
  }
  if (f.amx_tile && f.amx_bf16 && f.os_amx) f.amx_permitted = request_amx(f.amx_refusal);
#endif
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

void need(std::vector<std::string>& miss, bool have, const char* what) {
  if (!have) miss.emplace_back(what);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

std::string_view isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar:
      return "scalar";
    case CpuIsa::Avx2:
      return "avx2";
    case CpuIsa::Avx512:
      return "avx512";
    case CpuIsa::Avx512Bf16:
      return "avx512bf16";
    case CpuIsa::Amx:
      return "amx";
  }
  return "?";
}

std::string isa_missing(CpuIsa isa) {
  const Features& f = features();
  std::vector<std::string> miss;
#if !ATTNPROF_X86
  if (isa != CpuIsa::Scalar) return "an x86-64 CPU";
#endif
  const int level = static_cast<int>(isa);
  if (level >= static_cast<int>(CpuIsa::Avx2)) {
    need(miss, f.avx && f.avx2, "avx2");
    need(miss, f.fma, "fma");
    need(miss, f.f16c, "f16c");
    need(miss, f.os_avx, "OS support for the AVX state (XCR0)");
  }
  if (level >= static_cast<int>(CpuIsa::Avx512)) {
    need(miss, f.avx512f, "avx512f");
    need(miss, f.avx512bw, "avx512bw");
    need(miss, f.avx512vl, "avx512vl");
    need(miss, f.avx512dq, "avx512dq");
    if (f.avx512f) need(miss, f.os_avx512, "OS support for the ZMM and opmask state (XCR0)");
  }
  if (level >= static_cast<int>(CpuIsa::Avx512Bf16)) need(miss, f.avx512bf16, "avx512_bf16");
  if (level >= static_cast<int>(CpuIsa::Amx)) {
    need(miss, f.amx_tile, "amx_tile");
    need(miss, f.amx_bf16, "amx_bf16");
    if (f.amx_tile && f.amx_bf16) {
      need(miss, f.os_amx, "OS support for the AMX tile state (XCR0)");
      if (f.os_amx) need(miss, f.amx_permitted, f.amx_refusal.c_str());
    }
  }
  return join(miss);
}

CpuIsa best_isa() {
  CpuIsa best = CpuIsa::Scalar;
  for (CpuIsa isa : kAllCpuIsas) {
    if (!isa_missing(isa).empty()) break;
    best = isa;
  }
  return best;
}

IsaChoice choose_isa() {
  const CpuIsa best = best_isa();
  const char* env = std::getenv("ATTNPROF_CPU_ISA");
  const std::string forced = env ? env : "";
  if (forced.empty() || forced == "auto") {
    IsaChoice c{.isa = best, .why = std::string(isa_name(best)), .error = {}};
    if (best == CpuIsa::Amx) {
      c.why += " (the best this CPU has)";
    } else {
      const auto next = static_cast<CpuIsa>(static_cast<int>(best) + 1);
      c.why += " (no " + isa_missing(next) + ")";
    }
    return c;
  }
  for (CpuIsa isa : kAllCpuIsas) {
    if (forced != isa_name(isa)) continue;
    if (std::string miss = isa_missing(isa); !miss.empty()) {
      return {.isa = best,
              .why = {},
              .error = "ATTNPROF_CPU_ISA=" + forced + " cannot run on this CPU: it lacks " + miss +
                       " (best here: " + std::string(isa_name(best)) + ")"};
    }
    return {.isa = isa,
            .why = forced + " (forced by ATTNPROF_CPU_ISA; best here: " + std::string(isa_name(best)) + ")",
            .error = {}};
  }
  return {.isa = best,
          .why = {},
          .error = "ATTNPROF_CPU_ISA=" + forced +
                   " is not a CPU kernel level: use scalar, avx2, avx512, avx512bf16, amx "
                   "or auto"};
}

std::string isa_flags_present() {
  const Features& f = features();
  std::string s;
  const auto add = [&s](bool have, const char* name) {
    if (!have) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.sse2, "sse2");
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.avx512bf16, "avx512_bf16");
  add(f.amx_tile, "amx_tile");
  add(f.amx_bf16, "amx_bf16");
  if (f.amx_tile) s += f.amx_permitted ? " (amx tile data permitted)" : " (amx tile data not permitted)";
  return s;
}

}  // namespace attnprof::cpu
