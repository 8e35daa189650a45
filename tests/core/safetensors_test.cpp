// Safetensors: round trips, bf16/f16 bit patterns, sharded folders, corrupt files.
#include "core/safetensors.h"
#include "expect_error.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace st = longtron::safetensors;
using longtron::Error;
using longtron::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// Expects `fn` to throw Error whose message contains every string in `parts`.
using longtron::testing::expect_error;

std::string read_all(const fs::path& p) { return longtron::testing::read_file(p); }

void write_raw(const fs::path& p, const std::string& header, const std::string& data) {
  std::ofstream out(p, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

}  // namespace

TEST(Bf16, DecodesKnownBitPatterns) {
  EXPECT_EQ(st::bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(st::bf16_to_float(0xC000), -2.0f);
  EXPECT_EQ(st::bf16_to_float(0x4049), 3.140625f);
  EXPECT_EQ(st::bf16_to_float(0x0000), 0.0f);
  EXPECT_TRUE(std::isinf(st::bf16_to_float(0x7F80)));
  EXPECT_TRUE(std::isnan(st::bf16_to_float(0x7FC0)));
  EXPECT_EQ(st::bf16_to_float(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
}

TEST(Bf16, EncodesRoundToNearestEven) {
  auto f = [](uint32_t bits) { return std::bit_cast<float>(bits); };
  EXPECT_EQ(st::float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(st::float_to_bf16(f(0x3F808000)), 0x3F80);  // tie → even (down)
  EXPECT_EQ(st::float_to_bf16(f(0x3F818000)), 0x3F82);  // tie → even (up)
  EXPECT_EQ(st::float_to_bf16(f(0x3F808001)), 0x3F81);  // above the tie → up
  EXPECT_EQ(st::float_to_bf16(f(0x3F807FFF)), 0x3F80);  // below the tie → down
  EXPECT_EQ(st::float_to_bf16(f(0x7F7FFFFF)), 0x7F80);  // max float rounds to inf
  EXPECT_TRUE(std::isnan(st::bf16_to_float(st::float_to_bf16(std::nanf("")))));
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every non-NaN bf16 survives a round trip
    const float v = st::bf16_to_float(uint16_t(b));
    if (!std::isnan(v)) {
      ASSERT_EQ(st::float_to_bf16(v), b) << b;
    }
  }
}

TEST(F16, DecodesKnownBitPatterns) {
  EXPECT_EQ(st::f16_to_float(0x3C00), 1.0f);
  EXPECT_EQ(st::f16_to_float(0xC000), -2.0f);
  EXPECT_EQ(st::f16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(st::f16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(st::f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(st::f16_to_float(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(st::f16_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(st::f16_to_float(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(st::f16_to_float(0x8000)));
  EXPECT_TRUE(std::isinf(st::f16_to_float(0x7C00)));
  EXPECT_TRUE(std::isnan(st::f16_to_float(0x7E00)));
}

TEST(F16, EncodesRoundToNearestEven) {
  EXPECT_EQ(st::float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(st::float_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(st::float_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(st::float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie → even
  EXPECT_EQ(st::float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie → even
  EXPECT_EQ(st::float_to_f16(std::ldexp(1.0f, -25)), 0x0000);             // subnormal tie → 0
  EXPECT_EQ(st::float_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);         // subnormal tie → 2
  EXPECT_EQ(st::float_to_f16(std::ldexp(2047.0f, -25)), 0x0400);          // rounds up to normal
  EXPECT_EQ(st::float_to_f16(-2.0f), 0xC000);
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float v = st::f16_to_float(uint16_t(b));
    if (!std::isnan(v)) {
      ASSERT_EQ(st::float_to_f16(v), b) << b;
    }
  }
}

TEST(Safetensors, RoundTripAllDtypes) {
  TempDir dir;
  const std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.1f, 1e-3f, 7.0f};
  const std::vector<int64_t> steps = {42};
  const std::vector<double> d = {0.1, 1e300};
  const std::vector<int32_t> i32 = {-1, 2, 3};
  const auto path = dir / "x.safetensors";
  st::write_file(path,
                 {{"a.f32", {2, 3}, st::DType::F32, a.data(), nullptr},
                  {"a.bf16", {6}, st::DType::BF16, a.data(), nullptr},
                  {"a.f16", {3, 2}, st::DType::F16, a.data(), nullptr},
                  {"step", {}, st::DType::I64, nullptr, steps.data()},
                  {"d", {2}, st::DType::F64, nullptr, d.data()},
                  {"i", {3}, st::DType::I32, nullptr, i32.data()},
                  {"empty", {0, 4}, st::DType::F32, nullptr, nullptr}},
                 {{"format", "pt"}});
  const std::string bytes = read_all(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // header padded to 8 bytes like the reference writer

  st::File f(path);
  EXPECT_EQ(f.tensors().size(), 7u);
  EXPECT_EQ(f.metadata()["format"], "pt");
  std::vector<float> out(6);
  const std::vector<int64_t> shape = {2, 3};
  f.read_floats("a.f32", shape, out.data());
  EXPECT_EQ(out, a);
  const auto bf = f.read_floats("a.bf16");
  const auto hf = f.read_floats("a.f16");
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(bf[i], st::bf16_to_float(st::float_to_bf16(a[i])));
    EXPECT_EQ(hf[i], st::f16_to_float(st::float_to_f16(a[i])));
    EXPECT_NEAR(bf[i], a[i], std::fabs(a[i]) / 128);
  }
  EXPECT_EQ(f.read_ints("step"), steps);
  EXPECT_EQ(f.info("step").shape.size(), 0u);
  EXPECT_EQ(f.read_doubles("d"), d);
  EXPECT_EQ(f.read_ints("i"), (std::vector<int64_t>{-1, 2, 3}));
  EXPECT_EQ(f.info("empty").numel(), 0);
  expect_error([&] { f.read_floats("a.f32", std::vector<int64_t>{3, 2}, out.data()); },
               {"x.safetensors", "a.f32", "[2, 3]", "[3, 2]"});
  expect_error([&] { f.info("nope"); }, {"x.safetensors", "nope"});
  expect_error([&] { f.read_floats("step"); }, {"step", "I64"});
}

TEST(Safetensors, ShardedFolder) {
  TempDir dir;
  std::vector<std::vector<float>> data;
  std::vector<st::WriteTensor> tensors;
  for (int i = 0; i < 5; ++i) data.emplace_back(100, float(i));
  for (int i = 0; i < 5; ++i)
    tensors.push_back({fmt::format("t{}", i), {10, 10}, i % 2 ? st::DType::BF16 : st::DType::F32,
                       data[size_t(i)].data(), nullptr});
  const int shards = st::write_sharded(dir.path(), tensors, 500);
  EXPECT_GE(shards, 3);
  EXPECT_TRUE(fs::exists(dir / fmt::format("model-00001-of-{:05d}.safetensors", shards)));
  st::Reader r(dir.path());
  EXPECT_EQ(r.names().size(), 5u);
  std::vector<float> out(100);
  const std::vector<int64_t> shape = {10, 10};
  for (int i = 0; i < 5; ++i) {
    r.read_floats(fmt::format("t{}", i), shape, out.data());
    EXPECT_EQ(out, data[size_t(i)]);
  }
  // A missing shard is named.
  fs::remove(dir / fmt::format("model-00002-of-{:05d}.safetensors", shards));
  expect_error([&] { st::Reader bad(dir.path()); }, {"model.safetensors.index.json", "00002"});
}

TEST(Safetensors, IndexErrors) {
  TempDir dir;
  const std::vector<float> a(4, 1.0f);
  st::write_file(dir / "s1.safetensors", {{"a", {4}, st::DType::F32, a.data(), nullptr}});
  longtron::testing::write_file(dir / "model.safetensors.index.json",
                                R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  expect_error([&] { st::Reader r(dir.path()); }, {"index.json", "b", "s1.safetensors"});
  longtron::testing::write_file(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_error([&] { st::Reader r(dir.path()); }, {"index.json", "weight_map"});
  TempDir empty;
  expect_error([&] { st::Reader r(empty.path()); }, {empty.path().string(), "model.safetensors"});
}

TEST(Safetensors, CorruptFilesAreNamed) {
  TempDir dir;
  const std::vector<float> a(8, 2.0f);
  const auto good = dir / "good.safetensors";
  st::write_file(good, {{"w", {8}, st::DType::F32, a.data(), nullptr}});
  const std::string bytes = read_all(good);

  const auto p = dir / "bad.safetensors";
  longtron::testing::write_file(p, bytes.substr(0, bytes.size() - 4));  // truncated data
  expect_error([&] { st::File f(p); }, {"bad.safetensors", "w", "outside"});
  longtron::testing::write_file(p, bytes.substr(0, 5));  // shorter than the length field
  expect_error([&] { st::File f(p); }, {"bad.safetensors", "8-byte"});
  longtron::testing::write_file(p, bytes.substr(0, 20));  // header cut
  expect_error([&] { st::File f(p); }, {"bad.safetensors", "header length"});

  write_raw(p, "{not json", "");
  expect_error([&] { st::File f(p); }, {"bad.safetensors", "JSON"});
  write_raw(p, R"([1, 2])", "");
  expect_error([&] { st::File f(p); }, {"bad.safetensors", "object"});
  write_raw(p, R"({"w": {"dtype": "Q8", "shape": [2], "data_offsets": [0, 2]}})", "xx");
  expect_error([&] { st::File f(p); }, {"bad.safetensors", "w", "Q8"});
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", "xxxx");
  expect_error([&] { st::File f(p); }, {"bad.safetensors", "w", "8 bytes"});
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", "xxxx");
  expect_error([&] { st::File f(p); }, {"bad.safetensors", "reversed"});
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "xxxx");
  expect_error([&] { st::File f(p); }, {"bad.safetensors", "negative"});
  write_raw(p, R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", "xxxx");
  expect_error([&] { st::File f(p); }, {"bad.safetensors", "w", "shape"});
  expect_error([&] { st::File f(dir / "missing.safetensors"); }, {"missing.safetensors"});
}

TEST(Safetensors, WriteRejectsBadInput) {
  TempDir dir;
  const std::vector<float> a(4, 1.0f);
  const auto p = dir / "w.safetensors";
  expect_error([&] {
    st::write_file(p, {{"a", {4}, st::DType::F32, a.data(), nullptr},
                       {"a", {4}, st::DType::F32, a.data(), nullptr}});
  }, {"a", "twice"});
  expect_error([&] { st::write_file(p, {{"a", {4}, st::DType::F32, nullptr, nullptr}}); },
               {"a", "no data"});
  expect_error([&] { st::write_file(p, {{"a", {4}, st::DType::I64, a.data(), nullptr}}); },
               {"a", "I64"});
  EXPECT_FALSE(fs::exists(p));  // failed writes leave nothing behind
  for (const auto& e : fs::directory_iterator(dir.path())) ADD_FAILURE() << "left " << e.path();
}
