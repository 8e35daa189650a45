// The portable binary holds AVX-512 and AMX instructions only in the code compiled for them
// (ops/kernel_isa.h: the namespaces avx512, avx512bf16, native, emulated and the target-attributed
// *_avx512 helpers), so that an AVX2 CPU never meets one: the binary is disassembled with objdump
// and every function holding an EVEX-encoded (AVX-512) or AMX instruction is named.
#include <gtest/gtest.h>
#include <stdio.h>

#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

/// Whether an objdump -w instruction line ("  4010a0:\t62 f1 7c 48 10 00 \tvmovups ...") is
/// EVEX-encoded (first byte past the legacy prefixes 0x62, which in 64-bit mode is only EVEX) or
/// an AMX instruction (tile registers).
bool wide_instruction(const std::string& line) {
  const auto tab = line.find('\t');
  if (tab == std::string::npos) return false;
  const auto tab2 = line.find('\t', tab + 1);
  if (tab2 == std::string::npos) return false;
  std::istringstream bytes(line.substr(tab + 1, tab2 - tab - 1));
  for (std::string b; bytes >> b;) {
    if (b == "26" || b == "2e" || b == "36" || b == "3e" || b == "64" || b == "65" || b == "67")
      continue;
    if (b == "62") return true;
    break;
  }
  // AMX (VEX-encoded: by name), and anything objdump cannot decode.
  const std::string insn = line.substr(tab2 + 1);
  return insn.rfind("tile", 0) == 0 || insn.rfind("tdp", 0) == 0 || insn.rfind("ldtilecfg", 0) == 0 ||
         insn.rfind("sttilecfg", 0) == 0 || insn.find("%tmm") != std::string::npos ||
         insn.rfind("(bad)", 0) == 0;
}

/// The function's own qualified name: the demangled name without its template arguments and
/// parameter lists, so that a baseline function taking an AVX-512 namespace's type, or a
/// template instantiated with one, is not taken for AVX-512 code.
std::string own_name(const std::string& demangled) {
  std::string out;
  int angle = 0, paren = 0;
  for (size_t i = 0; i < demangled.size(); ++i) {
    const char ch = demangled[i];
    if (demangled.compare(i, 8, "operator") == 0) {  // operator() / operator< are names
      out += "operator";
      i += 7;
      continue;
    }
    if (ch == '<') ++angle;
    else if (ch == '>' && angle > 0) --angle;
    else if (ch == '(') ++paren;
    else if (ch == ')' && paren > 0) --paren;
    else if (angle == 0 && paren == 0) out += ch;
  }
  return out;
}

/// Whether a demangled function name belongs to code compiled for AVX-512 (or AMX).
bool avx512_code(const std::string& name) {
  const std::string own = own_name(name);
  for (const char* mark : {"::avx512::", "::avx512bf16::", "::native::", "::emulated::", "_avx512"})
    if (own.find(mark) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(BinaryIsa, Avx512InstructionsOnlyInAvx512Code) {
  if (LONGTRON_NATIVE_BUILD) GTEST_SKIP() << "built with -march=native: the whole binary is one CPU's";
  const std::string command = std::string("objdump -d -C -w --no-addresses ") + LONGTRON_BINARY + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  ASSERT_TRUE(pipe) << command;
  std::set<std::string> outside, inside;
  std::string function;
  std::vector<char> buffer(1 << 16);
  int64_t lines = 0;
  while (fgets(buffer.data(), static_cast<int>(buffer.size()), pipe.get()) != nullptr) {
    std::string line(buffer.data());
    ++lines;
    if (line.size() > 2 && line[0] == '<' && line.find(">:") != std::string::npos) {
      function = line.substr(1, line.rfind(">:") - 1);
      continue;
    }
    if (!wide_instruction(line)) continue;
    (avx512_code(function) ? inside : outside).insert(function);
  }
  ASSERT_GT(lines, 10000) << "objdump gave no disassembly: " << command;
  std::string names;
  for (const std::string& f : outside) names += "\n  " + f;
  EXPECT_TRUE(outside.empty()) << outside.size() << " functions outside the AVX-512 code hold "
                               << "AVX-512 or AMX instructions:" << names;
  // The scan sees the AVX-512 kernels it allows (it would pass vacuously on a disassembly it
  // cannot read).
  bool fp32 = false, bf16 = false;
  for (const std::string& f : inside) {
    fp32 = fp32 || f.find("::avx512::") != std::string::npos;
    bf16 = bf16 || f.find("::native::") != std::string::npos;
  }
  EXPECT_TRUE(fp32 && bf16) << inside.size() << " AVX-512 functions found";
}
