// A small RGB raster with the few drawing primitives the loss picture needs (lines, discs,
// rectangles, 5×7 bitmap text) and a PNG encoder on top of zlib. No anti-aliasing.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace longtron::report::raster {

/// An 8-bit sRGB colour.
struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(const Rgb&, const Rgb&) = default;
};

/// width × height pixels, row-major, 3 bytes per pixel. Drawing outside the image is clipped.
class Image {
 public:
  /// Throws Error when width or height is not positive.
  Image(int width, int height, Rgb background);

  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<uint8_t>& rgb() const { return rgb_; }
  Rgb at(int x, int y) const;

  void set(int x, int y, Rgb c);
  /// Fills x in [x0, x1), y in [y0, y1).
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);
  /// Outline of x in [x0, x1], y in [y0, y1], one pixel wide.
  void frame_rect(int x0, int y0, int x1, int y1, Rgb c);
  /// A line between pixel-centre coordinates, `thickness` pixels wide (a square brush stamped along
  /// the DDA path).
  void line(double x0, double y0, double x1, double y1, Rgb c, int thickness = 1);
  /// A filled disc of radius r (px) centred at (cx, cy).
  void disc(double cx, double cy, double r, Rgb c);

 private:
  int width_, height_;
  std::vector<uint8_t> rgb_;
};

/// Width in pixels of `text` drawn with font scale `scale` (each font pixel is scale × scale).
int text_width(std::string_view text, int scale);
/// Text height in pixels at `scale` (7 · scale).
int text_height(int scale);
/// Draws `text` left to right with its top-left corner at (x, y).
void draw_text(Image& image, std::string_view text, int x, int y, int scale, Rgb c);
/// Draws `text` rotated 90° counter-clockwise (reading bottom to top), starting at the bottom-left
/// corner (x, y): the glyph tops face left, as for a y-axis title.
void draw_text_up(Image& image, std::string_view text, int x, int y, int scale, Rgb c);

/// The image as a PNG file (8-bit truecolour, no interlace, filter type 0 on every scanline,
/// zlib-compressed IDAT; format per the PNG specification, ISO/IEC 15948). Throws Error when zlib
/// fails.
std::string encode_png(const Image& image);

}  // namespace longtron::report::raster
