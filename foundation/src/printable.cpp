#include "kdajit/printable.hpp"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

namespace kdajit {

namespace {

// Length of the UTF-8 sequence at s[i] (1..4), or 0 when it is not valid UTF-8
// (overlong forms, surrogates and code points past U+10FFFF are invalid).
size_t utf8_length(std::string_view s, size_t i, uint32_t* cp) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  unsigned char c = b(0);
  size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(k) & 0x3Fu);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}

// Code points a terminal may act on: C1 controls (0x9B is CSI) and the bidi
// overrides that reorder what follows them.
bool is_unsafe_code_point(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

// The escaping of printable() and printable_line(); `backslash`: a backslash is
// escaped too.
static std::string escape(std::string_view s, size_t max_bytes, bool backslash) {
  std::string out;
  out.reserve(std::min(s.size(), max_bytes) + 16);
  size_t i = 0;
  while (i < s.size() && i < max_bytes) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp = 0;
    size_t n = utf8_length(s, i, &cp);
    if (n == 0) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
      continue;
    }
    if (i + n > max_bytes) break;  // never cut a character in half
    if (n == 1 && (c < 0x20 || c == 0x7F)) {
      switch (c) {
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default: out += fmt::format("\\x{:02x}", c);
      }
    } else if (backslash && c == '\\') {
      out += "\\\\";  // so that an escape printed here is never mistaken for one in the input
    } else if (is_unsafe_code_point(cp)) {
      out += fmt::format("\\u{:04x}", cp);
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  if (i < s.size()) out += fmt::format("...({} more bytes)", s.size() - i);
  return out;
}

std::string printable(std::string_view s, size_t max_bytes) { return escape(s, max_bytes, /*backslash=*/true); }

std::string printable_line(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return escape(s, max_bytes, /*backslash=*/false);
  // The end of a message is usually its reason ("...: File name too long"): keep
  // both ends of a long one. Cut points move back to the start of a character.
  auto char_start = [&](size_t i) {
    while (i > 0 && i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    return i;
  };
  const size_t head = char_start(max_bytes / 2);
  const size_t tail = char_start(s.size() - (max_bytes - head));
  return escape(s.substr(0, head), head, false) + fmt::format("...({} bytes cut)...", tail - head) +
         escape(s.substr(tail), s.size() - tail, false);
}

}  // namespace kdajit
