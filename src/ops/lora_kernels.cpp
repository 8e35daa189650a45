// Fused LoRA adapter kernels (see lora_kernels.h): one driver over chunks and blocks of rows,
// two ways to run a block's products (fp32 tiles, or AVX512-BF16 dot products on bf16 operands).
#include "ops/lora_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "core/grow_buffer.h"
#include "ops/bf16_tile_gemm.h"
#include "ops/ops.h"
#include "ops/threads.h"
#include "ops/tile_gemm.h"

namespace longtron::ops {
namespace {

using detail::bf16_t;
using detail::round_up;
using detail::tile_gemm;

constexpr int64_t kBlockRows = 64;   // rows whose x and dy stay in L2 while all products run
constexpr int64_t kMinChunkRows = 256;
constexpr int64_t kMaxChunks = 16;   // partial sums kept: at most this many

/// Rows per chunk for N rows: a function of N only, so the partial sums (and their order) do not
/// depend on the thread count.
int64_t chunk_rows(int64_t N) {
  const int64_t even = (N + kMaxChunks - 1) / kMaxChunks;
  return std::max(kMinChunkRows, (even + kBlockRows - 1) / kBlockRows * kBlockRows);
}

bool parallel_worth(int64_t chunks, int64_t N, int64_t in, int64_t out, int64_t r) {
  return chunks > 1 && N * (in + out) * r > kParallelMinWork;
}

/// The calling thread's grow-only scratch (core/grow_buffer.h), handed out in 64-byte aligned
/// pieces: at least `bytes` of them.
class Arena {
 public:
  explicit Arena(int64_t bytes) {
    thread_local GrowBuffer<char> buffer;
    const uintptr_t start = reinterpret_cast<uintptr_t>(buffer.get(bytes + 64));
    next_ = reinterpret_cast<char*>((start + 63) & ~uintptr_t(63));
  }
  template <typename E>
  E* take(int64_t n) {
    E* p = reinterpret_cast<E*>(next_);
    next_ += round_up(n * int64_t(sizeof(E)), 64);
    return p;
  }
  /// Bytes take() uses for n elements of E.
  template <typename E>
  static int64_t size(int64_t n) {
    return round_up(n * int64_t(sizeof(E)), 64);
  }

 private:
  char* next_;
};

/// v as the nearest bf16 value (core/bf16.h's rounding) when bf16, else v.
inline float operand(float v, bool bf16) { return bf16 ? bf16_to_float(float_to_bf16(v)) : v; }

/// dst[i] = operand(src[i]) for n values.
void copy_operands(float* dst, const float* src, int64_t n, bool bf16) {
  for (int64_t i = 0; i < n; ++i) dst[i] = operand(src[i], bf16);
}

/// dst[cols, rows] = scale · operand(src[rows, cols])ᵀ.
void transpose_operands(float* dst, const float* src, int64_t rows, int64_t cols, float scale,
                        bool bf16) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * rows + i] = scale * operand(src[i * cols + j], bf16);
}

using Segment = LoraOutputs::Segment;

/// What both ways of running a block share: the call's operands and shapes. out: B's rows; y's
/// and dy's rows are ldy wide, B's rows landing in them as `segments` say.
struct Call {
  const float *x, *dy, *A, *B;
  const uint16_t *x16, *dy16;  // x's and dy's bf16 bits, when the caller has them
  float s;
  int64_t in, out, r;
  bool bf16;
  int64_t ldy;
  std::vector<Segment> segments;

  Call(const float* x_, const float* dy_, const float* A_, const float* B_, const uint16_t* x16_,
       const uint16_t* dy16_, float s_, int64_t in_, int64_t out_, int64_t r_, bool bf16_,
       const LoraOutputs& outputs)
      : x(x_), dy(dy_), A(A_), B(B_), x16(x16_), dy16(dy16_), s(s_), in(in_), out(out_), r(r_),
        bf16(bf16_), ldy(outputs.segments.empty() ? out_ : outputs.ldy),
        segments(outputs.segments.empty() ? std::vector<Segment>{{0, 0, out_}}
                                          : outputs.segments) {}
};

/// fp32 tiles (ops/tile_gemm.h). Under bf16 the operands are rounded to bf16 values first, so
/// the products are exact and only the fp32 accumulation remains: the same arithmetic as bf16
/// dot products, on any CPU.
class TileProducts {
 public:
  explicit TileProducts(const Call& c) : c_(c) {}

  int64_t scratch_bytes(int threads) const {
    const int64_t in = c_.in, out = c_.out, r = c_.r;
    const int64_t per_thread =
        2 * Arena::size<float>(kBlockRows * r) +
        (c_.bf16 ? Arena::size<float>(kBlockRows * in) + Arena::size<float>(kBlockRows * c_.ldy)
                 : 0);
    return 2 * Arena::size<float>(r * in) + Arena::size<float>(r * out) + threads * per_thread;
  }

  /// Aᵀ, A and s·B (or (s·B)ᵀ for the forward), rounded under bf16; per-thread rooms.
  void prepare(Arena& arena, int threads, bool backward) {
    const int64_t in = c_.in, out = c_.out, r = c_.r;
    At_ = arena.take<float>(r * in);
    Ar_ = arena.take<float>(r * in);
    sB_ = arena.take<float>(r * out);
    transpose_operands(At_, c_.A, r, in, 1.f, c_.bf16);
    copy_operands(Ar_, c_.A, r * in, c_.bf16);
    if (backward) {
      for (int64_t i = 0; i < out * r; ++i) sB_[i] = c_.s * operand(c_.B[i], c_.bf16);
    } else {
      transpose_operands(sB_, c_.B, out, r, c_.s, c_.bf16);  // (s·B)ᵀ [r, out]
    }
    rooms_.resize(size_t(threads));
    for (Room& room : rooms_) {
      room.u = arena.take<float>(kBlockRows * r);
      room.du = arena.take<float>(kBlockRows * r);
      room.x = c_.bf16 ? arena.take<float>(kBlockRows * in) : nullptr;
      room.dy = c_.bf16 ? arena.take<float>(kBlockRows * c_.ldy) : nullptr;
    }
  }

  /// y rows [n0, n0 + m) += u (s·B)ᵀ, each segment into its columns.
  void forward(int thread, float* y, int64_t n0, int64_t m) {
    Room& room = rooms_[size_t(thread)];
    const float* xb = rows(room.x, c_.x, c_.x16, n0, m, c_.in);
    down_project(room.u, xb, m);
    for (const Segment& g : c_.segments)
      tile_gemm<float>(m, g.count, c_.r, room.u, c_.r, 1, sB_ + g.b_row, c_.out,
                       y + n0 * c_.ldy + g.y_col, c_.ldy, true);
  }

  /// The block's terms: dBt [r, out] (+)= uᵀ dy, dA_c [r, in] (+)= duᵀ x, dx rows (+)= du A.
  void backward(int thread, float* dBt, float* dA_c, bool first, float* dx, bool accumulate_dx,
                int64_t n0, int64_t m) {
    Room& room = rooms_[size_t(thread)];
    const int64_t in = c_.in, out = c_.out, r = c_.r;
    const int64_t ldy = c_.ldy;
    const float* xb = rows(room.x, c_.x, c_.x16, n0, m, in);
    const float* dyb = rows(room.dy, c_.dy, c_.dy16, n0, m, ldy);
    down_project(room.u, xb, m);
    for (size_t i = 0; i < c_.segments.size(); ++i) {  // du = dy (s B), dBt (+)= uᵀ dy
      const Segment& g = c_.segments[i];
      tile_gemm<float>(m, r, g.count, dyb + g.y_col, ldy, 1, sB_ + g.b_row * r, r, room.du, r,
                       i > 0);
      tile_gemm<float>(r, g.count, m, room.u, 1, r, dyb + g.y_col, ldy, dBt + g.b_row, out,
                       !first);
    }
    if (c_.bf16) copy_operands(room.du, room.du, m * r, true);
    tile_gemm<float>(r, in, m, room.du, 1, r, xb, in, dA_c, in, !first);
    tile_gemm<float>(m, in, r, room.du, r, 1, Ar_, in, dx + n0 * in, in, accumulate_dx);
  }

 private:
  struct Room {
    float *u, *du, *x, *dy;
  };

  /// Rows [n0, n0 + m) of src (width w) as the products read them: src itself in fp32; under
  /// bf16 `bits` widened (src's rounding, when the caller has it), else src rounded, into room.
  const float* rows(float* room, const float* src, const uint16_t* bits, int64_t n0, int64_t m,
                    int64_t w) const {
    if (!c_.bf16) return src + n0 * w;
    if (bits == nullptr) {
      copy_operands(room, src + n0 * w, m * w, true);
    } else {
      for (int64_t i = 0; i < m * w; ++i) room[i] = bf16_to_float(bits[n0 * w + i]);
    }
    return room;
  }

  /// u [m, r] = x Aᵀ, then rounded to bf16 values under bf16 (the next products' operand).
  void down_project(float* u, const float* xb, int64_t m) const {
    tile_gemm<float>(m, c_.r, c_.in, xb, c_.in, 1, At_, c_.r, u, c_.r, false);
    if (c_.bf16) copy_operands(u, u, m * c_.r, true);
  }

  Call c_;
  float *At_ = nullptr, *Ar_ = nullptr, *sB_ = nullptr;
  std::vector<Room> rooms_;
};

// In a namespace of its own: code built for AVX512-BF16 (ops/kernel_isa.h), run only where the
// CPU has it.
namespace native {

/// AVX512-BF16 dot products (vdpbf16ps, ops/bf16_tile_gemm.h) on bf16 operands with fp32
/// accumulation: x and dy read as bits, A, B, u and du rounded to bf16, s applied to the fp32
/// products (as the GEMM path's alpha). A power-of-two s (alpha/r usually is) scales the rounded B
/// instead, exactly, and the sums then need no pass of their own. Needs r, in and the segments'
/// rows even and a CPU with AVX512-BF16 (attention_bf16_native).
class Bf16Products {
 public:
  static bool runs(const Call& c) {
    const bool even = std::all_of(c.segments.begin(), c.segments.end(), [](const Segment& g) {
      return g.b_row % 2 == 0 && g.count % 2 == 0;
    });
    return c.bf16 && c.r % 2 == 0 && c.in % 2 == 0 && even && attention_bf16_native();
  }
  explicit Bf16Products(const Call& c)
      : c_(c), ldr_(round_up(c.r, 16)), ldi_(round_up(c.in, 16)), ldo_(round_up(c.out, 16)),
        exact_scale_(power_of_two(c.s)) {}

  int64_t scratch_bytes(int threads) const {
    const int64_t in = c_.in, out = c_.out, r = c_.r;
    const int64_t weights = Arena::size<uint32_t>(in / 2 * ldr_) +
                            Arena::size<uint32_t>(out / 2 * ldr_) +
                            Arena::size<uint32_t>(r / 2 * ldi_) +
                            Arena::size<uint32_t>(r / 2 * ldo_ + 16) +
                            Arena::size<bf16_t>(std::max(in, out) * r);
    const int64_t per_thread =
        2 * Arena::size<float>(kBlockRows * r) + 4 * Arena::size<bf16_t>(kBlockRows * r) +
        Arena::size<bf16_t>(kBlockRows * in) + Arena::size<bf16_t>(kBlockRows * c_.ldy) +
        Arena::size<uint32_t>(kBlockRows / 2 * std::max(ldi_, ldo_)) +
        Arena::size<float>(kBlockRows * out);
    return weights + threads * per_thread;
  }

  /// The weights rounded and packed as pairs along each product's K: Aᵀ [in, r], B [out, r],
  /// A [r, in], Bᵀ [r, out]; per-thread rooms.
  void prepare(Arena& arena, int threads, bool) {
    const int64_t in = c_.in, out = c_.out, r = c_.r;
    bf16_t* tmp = arena.take<bf16_t>(std::max(in, out) * r);
    At_ = arena.take<uint32_t>(in / 2 * ldr_);
    B_ = arena.take<uint32_t>(out / 2 * ldr_);
    A_ = arena.take<uint32_t>(r / 2 * ldi_);
    Bt_ = arena.take<uint32_t>(r / 2 * ldo_ + 16);  // a segment's last vector may read past
    for (int64_t k = 0; k < r; ++k)
      for (int64_t i = 0; i < in; ++i) tmp[i * r + k] = float_to_bf16(c_.A[k * in + i]);
    detail::native::pack_pairs_of_rows(At_, ldr_, tmp, r, in, r);
    for (int64_t i = 0; i < r * in; ++i) tmp[i] = float_to_bf16(c_.A[i]);
    detail::native::pack_pairs_of_rows(A_, ldi_, tmp, in, r, in);
    for (int64_t i = 0; i < out * r; ++i) tmp[i] = b_operand(i);
    detail::native::pack_pairs_of_rows(B_, ldr_, tmp, r, out, r);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < r; ++k) tmp[k * out + o] = b_operand(o * r + k);
    detail::native::pack_pairs_of_rows(Bt_, ldo_, tmp, out, r, out);
    rooms_.resize(size_t(threads));
    for (Room& room : rooms_) {
      room.u = arena.take<float>(kBlockRows * r);
      room.du = arena.take<float>(kBlockRows * r);
      room.u16 = arena.take<bf16_t>(kBlockRows * r);
      room.du16 = arena.take<bf16_t>(kBlockRows * r);
      room.ut = arena.take<bf16_t>(kBlockRows * r);
      room.dut = arena.take<bf16_t>(kBlockRows * r);
      room.x16 = arena.take<bf16_t>(kBlockRows * in);
      room.dy16 = arena.take<bf16_t>(kBlockRows * c_.ldy);
      room.pairs = arena.take<uint32_t>(kBlockRows / 2 * std::max(ldi_, ldo_));
      room.t = arena.take<float>(kBlockRows * out);
    }
  }

  /// As TileProducts::forward and backward (defined below the class, in the bf16 target).
  LONGTRON_BF16_TARGET void forward(int thread, float* y, int64_t n0, int64_t m);
  LONGTRON_BF16_TARGET void backward(int thread, float* dBt, float* dA_c, bool first, float* dx,
                                     bool accumulate_dx, int64_t n0, int64_t m);

 private:
  struct Room {
    float *u, *du;
    bf16_t *u16, *du16, *ut, *dut, *x16, *dy16;  // ut, dut: [r, m rounded up to even]
    uint32_t* pairs;                             // x's or dy's rows packed as pairs
    float* t;                                    // a segment's u Bᵀ [m, count], before s
  };

  static bool power_of_two(float s) {
    int e = 0;
    return s > 0.f && std::frexp(s, &e) == 0.5f;
  }

  /// B's element i rounded (times s, exact, under exact_scale_).
  bf16_t b_operand(int64_t i) const {
    const float b = bf16_to_float(float_to_bf16(c_.B[i]));
    return float_to_bf16(exact_scale_ ? c_.s * b : b);
  }

  /// Rows [n0, n0 + m) of x or dy as bits: the caller's, or rounded into room.
  static const bf16_t* bits(bf16_t* room, const float* src, const uint16_t* given, int64_t n0,
                            int64_t m, int64_t w) {
    if (given != nullptr) return given + n0 * w;
    round_to_bf16_serial(src + n0 * w, m * w, room);  // inside the team: this thread alone
    return room;
  }

  /// v [m, r] rounded into v16 [m, r] and its transpose vt [r, me] (me = m rounded up to even,
  /// the odd row's pair partner zero).
  void round_rows(bf16_t* v16, bf16_t* vt, const float* v, int64_t m) const {
    const int64_t r = c_.r, me = round_up(m, 2);
    for (int64_t n = 0; n < m; ++n)
      for (int64_t k = 0; k < r; ++k) {
        const bf16_t b = float_to_bf16(v[n * r + k]);
        v16[n * r + k] = b;
        vt[k * me + n] = b;
      }
    if (me != m)
      for (int64_t k = 0; k < r; ++k) vt[k * me + m] = 0;
  }

  Call c_;
  int64_t ldr_, ldi_, ldo_;
  bool exact_scale_;  // s a power of two: B_ and Bt_ hold s·B (exact in bf16 barring subnormals)
  uint32_t *At_ = nullptr, *B_ = nullptr, *A_ = nullptr, *Bt_ = nullptr;
  std::vector<Room> rooms_;
};

LONGTRON_BF16_TARGET void Bf16Products::forward(int thread, float* y, int64_t n0, int64_t m) {
  using detail::native::bf16_gemm;
  Room& room = rooms_[size_t(thread)];
  const int64_t in = c_.in, r = c_.r;
  const bf16_t* xb = bits(room.x16, c_.x, c_.x16, n0, m, in);
  bf16_gemm(m, r, in / 2, xb, in, At_, ldr_, room.u, r, false, m);
  round_rows(room.u16, room.ut, room.u, m);
  for (const Segment& g : c_.segments) {  // y += s · (u Bᵀ)
    float* yb = y + n0 * c_.ldy + g.y_col;
    if (exact_scale_) {  // B holds s·B
      bf16_gemm(m, g.count, r / 2, room.u16, r, Bt_ + g.b_row, ldo_, yb, c_.ldy, true, m);
      continue;
    }
    bf16_gemm(m, g.count, r / 2, room.u16, r, Bt_ + g.b_row, ldo_, room.t, g.count, false, m);
    for (int64_t n = 0; n < m; ++n) {
      float* yn = yb + n * c_.ldy;
      const float* tn = room.t + n * g.count;
      for (int64_t j = 0; j < g.count; ++j) yn[j] += c_.s * tn[j];
    }
  }
}

LONGTRON_BF16_TARGET void Bf16Products::backward(int thread, float* dBt, float* dA_c, bool first,
                                               float* dx, bool accumulate_dx, int64_t n0,
                                               int64_t m) {
  using detail::native::bf16_gemm;
  Room& room = rooms_[size_t(thread)];
  const int64_t in = c_.in, out = c_.out, r = c_.r, ldy = c_.ldy, me = round_up(m, 2);
  const bf16_t* xb = bits(room.x16, c_.x, c_.x16, n0, m, in);
  const bf16_t* dyb = bits(room.dy16, c_.dy, c_.dy16, n0, m, ldy);
  bf16_gemm(m, r, in / 2, xb, in, At_, ldr_, room.u, r, false, m);         // u = x Aᵀ
  round_rows(room.u16, room.ut, room.u, m);
  for (size_t i = 0; i < c_.segments.size(); ++i) {  // du = s · (dy B)
    const Segment& g = c_.segments[i];
    bf16_gemm(m, r, g.count / 2, dyb + g.y_col, ldy, B_ + g.b_row / 2 * ldr_, ldr_, room.du,
              r, i > 0, m);
  }
  if (!exact_scale_)
    for (int64_t i = 0; i < m * r; ++i) room.du[i] *= c_.s;
  round_rows(room.du16, room.dut, room.du, m);
  for (const Segment& g : c_.segments) {  // dBt (+)= uᵀ dy
    const int64_t ldp = round_up(g.count, 16);
    detail::native::pack_pairs_of_rows(room.pairs, ldp, dyb + g.y_col, ldy, m, g.count);
    bf16_gemm(r, g.count, me / 2, room.ut, me, room.pairs, ldp, dBt + g.b_row, out, !first, r);
  }
  detail::native::pack_pairs_of_rows(room.pairs, ldi_, xb, in, m, in);
  bf16_gemm(r, in, me / 2, room.dut, me, room.pairs, ldi_, dA_c, in, !first, r);   // duᵀ x
  bf16_gemm(m, in, r / 2, room.du16, r, A_, ldi_, dx + n0 * in, in, accumulate_dx, m);
}

}  // namespace native

template <typename Products>
void forward_rows(Products& p, float* y, int64_t N, const Call& c) {
  const int64_t rows = chunk_rows(N), chunks = (N + rows - 1) / rows;
  const int threads = omp_get_max_threads();
  Arena arena(p.scratch_bytes(threads));
  p.prepare(arena, threads, false);
#pragma omp parallel if (parallel_worth(chunks, N, c.in, c.out, c.r))
  {
    const int thread = omp_get_thread_num();
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < chunks; ++ch)
      for (int64_t n0 = ch * rows; n0 < std::min(N, (ch + 1) * rows); n0 += kBlockRows)
        p.forward(thread, y, n0, std::min(kBlockRows, N - n0));
  }
}

template <typename Products>
void backward_rows(Products& p, float* dx, bool accumulate_dx, float* dA, float* dB, int64_t N,
                   const Call& c) {
  const int64_t in = c.in, out = c.out, r = c.r;
  const int64_t rows = chunk_rows(N), chunks = (N + rows - 1) / rows;
  const int64_t per_chunk = r * (out + in);  // Σ uᵀ dy [r, out], then Σ duᵀ x [r, in]
  const int threads = omp_get_max_threads();
  Arena arena(p.scratch_bytes(threads) + Arena::size<float>(chunks * per_chunk));
  float* partials = arena.take<float>(chunks * per_chunk);
  p.prepare(arena, threads, true);
#pragma omp parallel if (parallel_worth(chunks, N, in, out, r))
  {
    const int thread = omp_get_thread_num();
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      float* dBt = partials + ch * per_chunk;
      for (int64_t n0 = ch * rows; n0 < std::min(N, (ch + 1) * rows); n0 += kBlockRows)
        p.backward(thread, dBt, dBt + r * out, n0 == ch * rows, dx, accumulate_dx, n0,
                   std::min(kBlockRows, N - n0));
    }
    // The chunks' partials in chunk order: dB += s · Σ (uᵀ dy)ᵀ, dA += Σ duᵀ x.
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < r; ++k) {
        float sum = 0.f;
        for (int64_t ch = 0; ch < chunks; ++ch) sum += partials[ch * per_chunk + k * out + o];
        dB[o * r + k] += c.s * sum;
      }
#pragma omp for schedule(static)
    for (int64_t k = 0; k < r; ++k)
      for (int64_t i = 0; i < in; ++i) {
        float sum = 0.f;
        for (int64_t ch = 0; ch < chunks; ++ch) sum += partials[ch * per_chunk + r * out + k * in + i];
        dA[k * in + i] += sum;
      }
  }
}

}  // namespace

double lora_kernel_scratch_bytes(int64_t in, int64_t out, int64_t r, bool bf16) {
  const Call c(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1.f, in, out, r, bf16, {});
  const int threads = omp_get_max_threads();
  // The back-end depends on each linear's widths: the larger of the two.
  const double products = double(std::max(bf16 ? native::Bf16Products(c).scratch_bytes(threads) : 0,
                                           TileProducts(c).scratch_bytes(threads)));
  return products + double(kMaxChunks * r * (in + out)) * sizeof(float);
}

void lora_forward(float* y, const float* x, const float* A, const float* B, float s, int64_t N,
                  int64_t in, int64_t out, int64_t r, bool bf16, const uint16_t* x16,
                  const LoraOutputs& outputs) {
  if (N <= 0 || r <= 0) return;
  const Call c(x, nullptr, A, B, x16, nullptr, s, in, out, r, bf16, outputs);
  if (native::Bf16Products::runs(c)) {
    native::Bf16Products p(c);
    return forward_rows(p, y, N, c);
  }
  TileProducts p(c);
  forward_rows(p, y, N, c);
}

void lora_backward(float* dx, bool accumulate_dx, float* dA, float* dB, const float* dy,
                   const float* x, const float* A, const float* B, float s, int64_t N, int64_t in,
                   int64_t out, int64_t r, bool bf16, const uint16_t* x16,
                   const uint16_t* dy16, const LoraOutputs& outputs) {
  if (N <= 0 || r <= 0) {
    if (N > 0 && !accumulate_dx) std::fill(dx, dx + N * in, 0.f);
    return;
  }
  const Call c(x, dy, A, B, x16, dy16, s, in, out, r, bf16, outputs);
  if (native::Bf16Products::runs(c)) {
    native::Bf16Products p(c);
    return backward_rows(p, dx, accumulate_dx, dA, dB, N, c);
  }
  TileProducts p(c);
  backward_rows(p, dx, accumulate_dx, dA, dB, N, c);
}

}  // namespace longtron::ops
