// Scratch buffers of the parallel ops: grown on demand, reused across calls.
#pragma once

#include "core/grow_buffer.h"

namespace longtron::parallel {

/// A parallel op's scratch: core's GrowBuffer, zero-filled when it grows (its old contents are
/// lost); otherwise left as it is (callers overwrite what they read).
using Scratch = GrowBuffer<float, GrowFill::kZeroed>;

}  // namespace longtron::parallel
