// Safetensors files that a tester fed to `eval` and that got through or crashed: a header nested
// 100,000 levels deep, tensors that share or overlap byte ranges, duplicate names, holes in the
// data buffer, and weights holding NaN or infinity.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/safetensors.h"
#include "expect_error.h"
#include "test_util.h"

namespace st = longtron::safetensors;
using longtron::testing::expect_error;
using longtron::testing::TempDir;
namespace fs = std::filesystem;

namespace {

void write_raw(const fs::path& p, const std::string& header, const std::string& data) {
  std::ofstream out(p, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

std::string nested(const std::string& inner, int depth) {
  return std::string(size_t(depth), '[') + inner + std::string(size_t(depth), ']');
}

// The message of the Error `fn` throws ("" if it throws none).
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const longtron::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// A shape or data_offsets nested 100,000 levels deep ended in signal 11 while the error message
// was being built (the whole value was printed). Now the parse depth is bounded and the message
// stays short.
TEST(SafetensorsBadInput, DeepNestingIsACleanShortError) {
  TempDir dir;
  const auto p = dir / "deep.safetensors";
  for (const char* key : {"shape", "data_offsets"}) {
    for (int depth : {1000, 30000, 100000}) {
      const std::string other = std::string(key) == "shape" ? R"("data_offsets": [0, 4])"
                                                            : R"("shape": [1])";
      write_raw(p, R"({"w": {"dtype": "F32", ")" + std::string(key) + "\": " + nested("1", depth) +
                       ", " + other + "}}",
                "xxxx");
      const std::string message = error_of([&] { st::File f(p); });
      ASSERT_FALSE(message.empty()) << key << " depth " << depth;
      EXPECT_NE(message.find("deep.safetensors"), std::string::npos) << message;
      EXPECT_LT(message.size(), 600u) << message.substr(0, 600);
    }
  }
  // Deep nesting anywhere (metadata, an unknown key, the top level) is refused the same way.
  write_raw(p, R"({"__metadata__": {"a": )" + nested("1", 100000) + "}}", "");
  expect_error([&] { st::File f(p); }, {"deep.safetensors", "nested deeper than"});
  write_raw(p, nested("1", 100000), "");
  expect_error([&] { st::File f(p); }, {"deep.safetensors", "nested deeper than"});
}

// A long tensor name or dtype is shown shortened, never whole.
TEST(SafetensorsBadInput, LongUntrustedStringsAreShortened) {
  TempDir dir;
  const auto p = dir / "long.safetensors";
  const std::string name(1'000'000, 'n');
  write_raw(p, "{\"" + name + R"(": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 4]}})", "xxxx");
  std::string message = error_of([&] { st::File f(p); });
  ASSERT_FALSE(message.empty());
  EXPECT_LT(message.size(), 600u);
  EXPECT_NE(message.find("nnnn"), std::string::npos) << message;
  write_raw(p, R"({"w": {"dtype": ")" + name + R"(", "shape": [1], "data_offsets": [0, 4]}})", "xxxx");
  message = error_of([&] { st::File f(p); });
  ASSERT_FALSE(message.empty());
  EXPECT_LT(message.size(), 600u);
}

// Two tensors sharing one byte range, overlapping neighbours and a duplicate name were accepted
// (loss printed, exit 0). The tensors must tile the data buffer exactly.
TEST(SafetensorsBadInput, TensorsMustTileTheDataBuffer) {
  TempDir dir;
  const auto p = dir / "tile.safetensors";
  const std::string data(16, '\0');
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
            data.substr(0, 8));
  expect_error([&] { st::File f(p); }, {"tile.safetensors", "overlap", "a", "b"});
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
            data);
  expect_error([&] { st::File f(p); }, {"tile.safetensors", "overlap", "[8, 16]"});
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
            data);
  expect_error([&] { st::File f(p); }, {"tile.safetensors", "tensor a", "twice"});
  // A hole between tensors, data before the first one, and bytes after the last one.
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
            data);
  expect_error([&] { st::File f(p); }, {"tile.safetensors", "hole", "[4, 8)"});
  write_raw(p, R"({"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", data);
  expect_error([&] { st::File f(p); }, {"tile.safetensors", "hole", "[0, 8)"});
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", data);
  expect_error([&] { st::File f(p); }, {"tile.safetensors", "16 data bytes", "8 of them"});
  // A shape whose element count overflows 64 bits is refused, not wrapped around to fit.
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
            "");
  expect_error([&] { st::File f(p); }, {"tile.safetensors", "tensor a", "too large"});
  // The exact tiling itself is accepted, including zero-size tensors and an empty file.
  write_raw(p, R"({"z": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
                   "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]}})",
            data);
  EXPECT_EQ(st::File(p).tensors().size(), 3u);
  write_raw(p, "{}", "");
  EXPECT_TRUE(st::File(p).tensors().empty());
}

// A NaN in a norm weight made `eval` print `loss -nan` and exit 0. Loading any floating tensor
// with a non-finite value is an error naming the tensor and the element.
TEST(SafetensorsBadInput, NonFiniteValuesAreRefusedNamingTheTensor) {
  TempDir dir;
  const auto p = dir / "nan.safetensors";
  std::vector<float> w(6, 1.0f);
  w[4] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> ok(3, 0.5f);
  st::write_file(p, {{"model.norm.weight", {6}, st::DType::F32, w.data(), nullptr},
                     {"ok", {3}, st::DType::BF16, ok.data(), nullptr}});
  const st::File f(p);
  expect_error([&] { f.read_floats("model.norm.weight"); },
               {"nan.safetensors", "model.norm.weight", "element 4", "not finite"});
  EXPECT_EQ(f.read_floats("ok"), ok);
  const st::Reader reader(p);
  std::vector<float> out(6);
  const int64_t shape[] = {6};
  expect_error([&] { reader.read_floats("model.norm.weight", shape, out.data()); },
               {"model.norm.weight", "not finite"});
  // Infinity in every floating dtype.
  for (auto dtype : {st::DType::F32, st::DType::BF16, st::DType::F16}) {
    std::vector<float> inf(2, 1.0f);
    inf[1] = -std::numeric_limits<float>::infinity();
    st::write_file(p, {{"x", {2}, dtype, inf.data(), nullptr}});
    expect_error([&] { st::File(p).read_floats("x"); }, {"tensor x", "element 1", "not finite"});
  }
  const double big[] = {1.0, 1e300};  // finite in F64, infinite once narrowed to float
  st::write_file(p, {{"x", {2}, st::DType::F64, nullptr, big}});
  expect_error([&] { st::File(p).read_floats("x"); }, {"tensor x", "element 1", "not finite"});
  const double nan[] = {std::nan("")};
  st::write_file(p, {{"x", {1}, st::DType::F64, nullptr, nan}});
  expect_error([&] { st::File(p).read_doubles("x"); }, {"tensor x", "element 0", "not finite"});
}
