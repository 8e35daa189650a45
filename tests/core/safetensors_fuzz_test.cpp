// Fuzz test of the safetensors reader: valid files (several tensors of every floating dtype and
// I64) get seeded random mutations (fuzz_util.h), mostly in the JSON header. Each case must end
// in a clean longtron error naming the file, or in a file with the same tensors (a header change
// may only rename one) whose values read exactly as the mutated bytes decode — refused when one
// is not finite. Never a crash, a hang, another exception type, or silently other content.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "core/error.h"
#include "core/safetensors.h"
#include "fuzz_util.h"
#include "test_util.h"

namespace st = longtron::safetensors;
using longtron::Error;
using longtron::testing::expect_clean_error;
using longtron::testing::FuzzTally;
using longtron::testing::Mutation;
using longtron::testing::Mutator;
using longtron::testing::read_file;
using longtron::testing::TempDir;
using longtron::testing::write_file;

namespace {

// The values of `t` decoded from `data` (the file's data section) as float, as the format says.
std::vector<double> decode(const st::TensorInfo& t, const std::string& data) {
  std::vector<double> out;
  const char* p = data.data() + t.begin;
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint16_t h;
    float f;
    double d;
    int64_t l;
    switch (t.dtype) {
      case st::DType::F32: std::memcpy(&f, p + 4 * i, 4); out.push_back(f); break;
      case st::DType::BF16: std::memcpy(&h, p + 2 * i, 2); out.push_back(st::bf16_to_float(h)); break;
      case st::DType::F16: std::memcpy(&h, p + 2 * i, 2); out.push_back(st::f16_to_float(h)); break;
      case st::DType::F64: std::memcpy(&d, p + 8 * i, 8); out.push_back(float(d)); break;
      default: std::memcpy(&l, p + 8 * i, 8); out.push_back(double(l)); break;
    }
  }
  return out;
}

bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

}  // namespace

TEST(SafetensorsFuzz, MutatedFilesAreRefusedOrReadExactly) {
  TempDir dir(longtron::testing::fuzz_temp_base());
  Mutator rng(1234);
  FuzzTally tally{"safetensors"};
  const auto path = dir / "f.safetensors";
  static constexpr st::DType kFloat[] = {st::DType::F32, st::DType::BF16, st::DType::F16};
  for (int c = 0; c < 2400; ++c) {
    // 1-4 tensors with random shapes (zero-size ones included) and finite values.
    const size_t count = 1 + rng.below(4);
    std::vector<std::vector<float>> values(count);
    std::vector<std::vector<double>> f64(count);
    std::vector<std::vector<int64_t>> ints(count);
    std::vector<st::WriteTensor> tensors;
    for (size_t i = 0; i < count; ++i) {
      std::vector<int64_t> shape(rng.below(3));
      for (auto& d : shape) d = int64_t(rng.below(4));
      int64_t n = 1;
      for (auto d : shape) n *= d;
      const std::string name = "model.layers." + std::to_string(i) + ".w";
      const size_t kind = rng.below(5);
      if (kind < 3) {
        for (int64_t k = 0; k < n; ++k) values[i].push_back(float(rng.below(2000)) / 64 - 15);
        tensors.push_back({name, shape, kFloat[kind], values[i].data(), nullptr});
      } else if (kind == 3) {
        for (int64_t k = 0; k < n; ++k) f64[i].push_back(double(rng.below(2000)) / 64 - 15);
        tensors.push_back({name, shape, st::DType::F64, nullptr, f64[i].data()});
      } else {
        for (int64_t k = 0; k < n; ++k) ints[i].push_back(int64_t(rng.below(100)));
        tensors.push_back({name, shape, st::DType::I64, nullptr, ints[i].data()});
      }
    }
    std::map<std::string, std::string> meta;
    if (rng.below(2)) meta["format"] = "pt";
    st::write_file(path, tensors, meta);
    const std::string good = read_file(path);
    uint64_t header_len;
    std::memcpy(&header_len, good.data(), 8);
    const size_t data_start = 8 + header_len;
    std::vector<st::TensorInfo> original;
    {
      const st::File f(path);
      original = f.tensors();
    }
    // Three cases in four change the header (its length field included).
    const Mutation m = rng.mutate(good, 0, rng.below(4) ? data_start : good.size());
    write_file(path, m.bytes);
    try {
      const st::File f(path);
      const std::string data = m.bytes.substr(std::min(data_start, m.bytes.size()));
      ASSERT_EQ(f.tensors().size(), original.size()) << m.kind << " at " << m.offset;
      int renamed = 0;
      for (size_t i = 0; i < original.size(); ++i) {
        const auto& t = f.tensors()[i];
        const auto& o = original[i];
        // An empty tensor's shape may change to another empty shape: still a valid file that says
        // exactly that (no byte of content moves).
        const bool same_shape = t.shape == o.shape || (t.numel() == 0 && o.numel() == 0);
        ASSERT_TRUE(t.dtype == o.dtype && same_shape && t.begin == o.begin && t.end == o.end)
            << m.kind << " at " << m.offset << ": tensor " << o.name << " changed: "
            << st::shape_string(o.shape) << " -> " << st::shape_string(t.shape) << ", dtype "
            << st::dtype_name(o.dtype) << " -> " << st::dtype_name(t.dtype) << ", ["
            << o.begin << "," << o.end << ") -> [" << t.begin << "," << t.end << ")";
        renamed += t.name != o.name;
        const auto want = decode(t, data);
        try {
          if (t.dtype == st::DType::I64) {
            const auto got = f.read_ints(t.name);
            ASSERT_EQ(std::vector<double>(got.begin(), got.end()), want);
          } else {
            const auto got = f.read_floats(t.name);
            ASSERT_TRUE(all_finite(want)) << "read a non-finite value without an error";
            ASSERT_EQ(std::vector<double>(got.begin(), got.end()), want) << m.kind << " at " << m.offset;
          }
        } catch (const Error& e) {
          ASSERT_FALSE(all_finite(want)) << e.what();
          EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
        }
      }
      ASSERT_LE(renamed, m.offset < data_start ? 1 : 0) << m.kind << " at " << m.offset;
      ++tally.reads;
    } catch (const Error& e) {
      expect_clean_error(e, path.string(), m);
      ++tally.errors;
    }
  }
  EXPECT_GE(tally.cases(), 2000);
}
