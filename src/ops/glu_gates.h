// The gates of the gated FFNs, element by element: SwiGLU's silu (InternLM2, Llama, Qwen, Mistral)
// and GeGLU's tanh GELU (Gemma), each as out = act(a) · b with its two partial derivatives, so
// that one loop of each kernel (float, double, bf16 inputs) serves both. Expressions are written
// in the order the kernels have always evaluated them (the SwiGLU bits are unchanged).
#pragma once
#include "ops/fast_math.h"
#include "ops/kernel_isa.h"

LONGTRON_ISA_BEGIN

/// silu(a) · b, silu(x) = x · sigmoid(x); silu'(x) = s + x·s·(1 − s), s = sigmoid(x).
struct SiluGate {
  template <typename T>
  static T out(T x, T y) {
    const T s = T(1) / (T(1) + fast_exp(-x));
    return x * s * y;
  }
  template <typename T>
  static T da(T g, T x, T y) {
    const T s = T(1) / (T(1) + fast_exp(-x));
    return g * y * (s + x * s * (T(1) - s));
  }
  template <typename T>
  static T db(T g, T x) {
    const T s = T(1) / (T(1) + fast_exp(-x));
    return g * x * s;
  }
};

/// gelu_tanh(a) · b, gelu_tanh(x) = ½x(1 + t), t = tanh(√(2/π)(x + 0.044715x³)) (torch's
/// gelu(approximate="tanh")); gelu_tanh'(x) = ½(1 + t) + ½x(1 − t²)·√(2/π)(1 + 3·0.044715x²).
/// tanh(u) = 1 − 2 / (e^{2u} + 1) through fast_exp, so that float loops vectorise; at fast_exp's
/// clamps it gives ±1 (in double, e^{2u} = ∞ gives 1).
struct GeluTanhGate {
  static constexpr double kSqrt2OverPi = 0.79788456080286535588;  // √(2/π)
  static constexpr double kCubic = 0.044715;
  template <typename T>
  static T tanh_arg(T x) {
    const T u = T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x);
    return T(1) - T(2) / (fast_exp(T(2) * u) + T(1));
  }
  template <typename T>
  static T gelu(T x) {
    return T(0.5) * x * (T(1) + tanh_arg(x));
  }
  template <typename T>
  static T out(T x, T y) {
    return gelu(x) * y;
  }
  template <typename T>
  static T da(T g, T x, T y) {
    const T t = tanh_arg(x);
    const T slope = T(0.5) * (T(1) + t) +
                    T(0.5) * x * (T(1) - t * t) * T(kSqrt2OverPi) * (T(1) + T(3 * kCubic) * x * x);
    return g * y * slope;
  }
  template <typename T>
  static T db(T g, T x) {
    return g * gelu(x);
  }
};

LONGTRON_ISA_END
