// Raster drawing and PNG encoding for raster.h.
#include "report/raster.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "report/bitmap_font.h"

namespace longtron::report::raster {

Image::Image(int width, int height, Rgb background) : width_(width), height_(height) {
  check(width > 0 && height > 0, "raster: image size {}x{} must be positive", width, height);
  rgb_.resize(size_t(width) * size_t(height) * 3);
  for (size_t i = 0; i < rgb_.size(); i += 3)
    rgb_[i] = background.r, rgb_[i + 1] = background.g, rgb_[i + 2] = background.b;
}

Rgb Image::at(int x, int y) const {
  const size_t i = (size_t(y) * size_t(width_) + size_t(x)) * 3;
  return {rgb_[i], rgb_[i + 1], rgb_[i + 2]};
}

void Image::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  const size_t i = (size_t(y) * size_t(width_) + size_t(x)) * 3;
  rgb_[i] = c.r, rgb_[i + 1] = c.g, rgb_[i + 2] = c.b;
}

void Image::fill_rect(int x0, int y0, int x1, int y1, Rgb c) {
  for (int y = std::max(y0, 0); y < std::min(y1, height_); ++y)
    for (int x = std::max(x0, 0); x < std::min(x1, width_); ++x) set(x, y, c);
}

void Image::frame_rect(int x0, int y0, int x1, int y1, Rgb c) {
  fill_rect(x0, y0, x1 + 1, y0 + 1, c);
  fill_rect(x0, y1, x1 + 1, y1 + 1, c);
  fill_rect(x0, y0, x0 + 1, y1 + 1, c);
  fill_rect(x1, y0, x1 + 1, y1 + 1, c);
}

void Image::line(double x0, double y0, double x1, double y1, Rgb c, int thickness) {
  // One brush stamp per pixel step along the longer axis keeps the line gap-free.
  const double n = std::max({std::fabs(x1 - x0), std::fabs(y1 - y0), 1.0});
  const int steps = static_cast<int>(std::ceil(n));
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  for (int i = 0; i <= steps; ++i) {
    const double t = double(i) / steps;
    const int x = static_cast<int>(std::lround(x0 + t * (x1 - x0)));
    const int y = static_cast<int>(std::lround(y0 + t * (y1 - y0)));
    fill_rect(x + lo, y + lo, x + hi + 1, y + hi + 1, c);
  }
}

void Image::disc(double cx, double cy, double r, Rgb c) {
  const int x0 = int(std::floor(cx - r)), x1 = int(std::ceil(cx + r));
  const int y0 = int(std::floor(cy - r)), y1 = int(std::ceil(cy + r));
  for (int y = y0; y <= y1; ++y)
    for (int x = x0; x <= x1; ++x)
      if ((x - cx) * (x - cx) + (y - cy) * (y - cy) <= r * r + 0.25) set(x, y, c);
}

int text_width(std::string_view text, int scale) {
  if (text.empty()) return 0;
  return (int(text.size()) * font::kAdvance - 1) * scale;
}

int text_height(int scale) { return font::kGlyphHeight * scale; }

namespace {

/// Calls plot(u, v) for every set font pixel of `text`, u along the text, v down the glyph, both
/// in font pixels.
template <typename Plot>
void for_each_font_pixel(std::string_view text, Plot&& plot) {
  for (size_t i = 0; i < text.size(); ++i) {
    const font::Glyph g = font::glyph(text[i]);
    for (int v = 0; v < font::kGlyphHeight; ++v)
      for (int u = 0; u < font::kGlyphWidth; ++u)
        if (g.rows[size_t(v)] & (1u << (font::kGlyphWidth - 1 - u)))
          plot(int(i) * font::kAdvance + u, v);
  }
}

}  // namespace

void draw_text(Image& image, std::string_view text, int x, int y, int scale, Rgb c) {
  for_each_font_pixel(text, [&](int u, int v) {
    image.fill_rect(x + u * scale, y + v * scale, x + (u + 1) * scale, y + (v + 1) * scale, c);
  });
}

void draw_text_up(Image& image, std::string_view text, int x, int y, int scale, Rgb c) {
  // Rotating 90° counter-clockwise maps (u, v) to (x + v, y - u).
  for_each_font_pixel(text, [&](int u, int v) {
    image.fill_rect(x + v * scale, y - (u + 1) * scale, x + (v + 1) * scale, y - u * scale, c);
  });
}

namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((v >> shift) & 0xff);
}

/// Appends a chunk: length, type, data, CRC-32 of type and data.
void put_chunk(std::string& out, const char type[4], const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t start = out.size();
  out.append(type, 4);
  out += data;
  const auto* bytes = reinterpret_cast<const Bytef*>(out.data() + start);
  put_u32(out, static_cast<uint32_t>(crc32(0L, bytes, static_cast<uInt>(out.size() - start))));
}

}  // namespace

std::string encode_png(const Image& image) {
  const size_t row_bytes = size_t(image.width()) * 3;
  std::string raw;  // each scanline: filter byte 0 (None), then the RGB bytes
  raw.reserve((row_bytes + 1) * size_t(image.height()));
  for (int y = 0; y < image.height(); ++y) {
    raw += '\0';
    raw.append(reinterpret_cast<const char*>(image.rgb().data()) + size_t(y) * row_bytes, row_bytes);
  }
  uLongf packed_size = compressBound(static_cast<uLong>(raw.size()));
  std::string packed(packed_size, '\0');
  const int rc = compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
                           reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()),
                           Z_BEST_COMPRESSION);
  check(rc == Z_OK, "png: zlib compress2 failed with code {}", rc);
  packed.resize(packed_size);

  std::string ihdr;
  put_u32(ihdr, static_cast<uint32_t>(image.width()));
  put_u32(ihdr, static_cast<uint32_t>(image.height()));
  ihdr += std::string{8, 2, 0, 0, 0};  // bit depth 8, colour type 2 (RGB), deflate, filter 0, no interlace
  std::string png = "\x89PNG\r\n\x1a\n";
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", packed);
  put_chunk(png, "IEND", "");
  return png;
}

}  // namespace longtron::report::raster
