#include "ops/precision.h"

namespace longtron::ops {
namespace {
thread_local ComputeType current = ComputeType::kFloat32;
}  // namespace

ComputeType compute_type() { return current; }

ComputeTypeScope::ComputeTypeScope(ComputeType type) : previous_(current) { current = type; }

ComputeTypeScope::~ComputeTypeScope() { current = previous_; }

}  // namespace longtron::ops
