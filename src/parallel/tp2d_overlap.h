// parallel.tensor_2d.overlap: the one list of its values, read by the config check and by the 2D
// mode, so that every value the config accepts is one the engine runs (tests/train/config_test).
// Names are MindSpeed's flags (--enable-overlap-ag-with-matmul, --enable-overlap-matmul-with-rs);
// MindSpeed allows one forward overlap at a time, so there is no "both".
#pragma once
#include <array>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "core/error.h"

namespace longtron::parallel {

/// The forward overlap of the 2D linears (parallel/tp_linear.h).
enum class Overlap2D { kNone, kAgWithMatmul, kMatmulWithRs };
/// The config spellings of Overlap2D, in Overlap2D order.
inline constexpr std::array<EnumName<Overlap2D>, 3> kOverlap2DNames{
    {{Overlap2D::kNone, "none"},
     {Overlap2D::kAgWithMatmul, "ag_with_matmul"},
     {Overlap2D::kMatmulWithRs, "matmul_with_rs"}}};

/// Every accepted value, in Overlap2D order.
inline const std::vector<std::string>& overlap_2d_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& e : kOverlap2DNames) out.push_back(e.name);
    return out;
  }();
  return names;
}

/// The value's name (one of overlap_2d_names()).
inline const char* overlap_2d_name(Overlap2D overlap) { return enum_name(kOverlap2DNames, overlap); }

/// One of overlap_2d_names(); throws Error naming `key`, the value and the accepted values.
inline Overlap2D parse_overlap_2d(const std::string& name,
                                  const std::string& key = "parallel.tensor_2d.overlap") {
  if (const auto overlap = find_enum(kOverlap2DNames, name)) return *overlap;
  fail("{}: '{}' is not one of \"none\", \"ag_with_matmul\", \"matmul_with_rs\" (MindSpeed's "
       "names; one forward overlap at a time)", key, name);
}

}  // namespace longtron::parallel
