#include "data/byte_level.hpp"

#include <vector>

namespace meshtrain {

namespace {

bool stands_for_itself(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::vector<int> from_char = std::vector<int>(0x200, -1);  // code points used are < 0x144
  Tables() {
    char32_t next = 0x100;
    for (unsigned b = 0; b < 256; ++b) {
      to_char[b] = stands_for_itself(b) ? char32_t(b) : next++;
      from_char[to_char[b]] = int(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else {  // the alphabet stays below U+0800
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

}  // namespace

char32_t byte_level_char(unsigned char b) { return tables().to_char[b]; }

std::optional<std::string> byte_level_to_bytes(std::string_view text) {
  const Tables& t = tables();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    char32_t cp;
    if (c < 0x80) {
      cp = c, i += 1;
    } else if ((c >> 5) == 0x6 && i + 1 < text.size()) {
      cp = char32_t(c & 0x1F) << 6 | (static_cast<unsigned char>(text[i + 1]) & 0x3F), i += 2;
    } else {
      return std::nullopt;  // 3- and 4-byte characters are outside the alphabet
    }
    if (cp >= t.from_char.size() || t.from_char[cp] < 0) return std::nullopt;
    out += char(t.from_char[cp]);
  }
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char b : bytes) append_utf8(out, tables().to_char[static_cast<unsigned char>(b)]);
  return out;
}

}  // namespace meshtrain
