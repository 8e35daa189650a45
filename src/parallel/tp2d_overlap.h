// parallel.tensor_2d.overlap: the one list of its values, read by the config check and by the 2D
// mode, so that every value the config accepts is one the engine runs (tests/train/config_test).
// Names are MindSpeed's flags (--enable-overlap-ag-with-matmul, --enable-overlap-matmul-with-rs);
// MindSpeed allows one forward overlap at a time, so there is no "both".
#pragma once
#include <string>
#include <vector>

#include "core/error.h"

namespace longtron::parallel {

/// The forward overlap of the 2D linears (parallel/tp_linear.h).
enum class Overlap2D { kNone, kAgWithMatmul, kMatmulWithRs };

/// Every accepted value, in Overlap2D order.
inline const std::vector<std::string>& overlap_2d_names() {
  static const std::vector<std::string> names = {"none", "ag_with_matmul", "matmul_with_rs"};
  return names;
}

/// The value's name (one of overlap_2d_names()).
inline const char* overlap_2d_name(Overlap2D overlap) {
  return overlap_2d_names()[static_cast<size_t>(overlap)].c_str();
}

/// One of overlap_2d_names(); throws Error naming `key`, the value and the accepted values.
inline Overlap2D parse_overlap_2d(const std::string& name,
                                  const std::string& key = "parallel.tensor_2d.overlap") {
  const auto& names = overlap_2d_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<Overlap2D>(i);
  fail("{}: '{}' is not one of \"none\", \"ag_with_matmul\", \"matmul_with_rs\" (MindSpeed's "
       "names; one forward overlap at a time)", key, name);
}

}  // namespace longtron::parallel
