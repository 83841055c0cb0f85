#include "config/toml_value.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace meshtrain::toml {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Reads `[0-9](_?[0-9])*` from s[i]; returns the digits without underscores, or nullopt when
// the run is empty or an underscore is not between two digits (TOML 1.0, "Integer").
std::optional<std::string> digits(const std::string& s, size_t& i) {
  std::string out;
  if (i >= s.size() || !is_digit(s[i])) return std::nullopt;
  while (i < s.size()) {
    if (is_digit(s[i])) {
      out += s[i++];
    } else if (s[i] == '_' && i + 1 < s.size() && is_digit(s[i + 1])) {
      ++i;
    } else {
      break;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Index just past the string literal that starts at s[i] (a quote), or npos if unterminated.
size_t skip_string(const std::string& s, size_t i) {
  const char q = s[i];
  for (size_t j = i + 1; j < s.size(); ++j) {
    if (q == '"' && s[j] == '\\') {
      ++j;  // an escaped character never closes the string
    } else if (s[j] == q) {
      return j + 1;
    }
  }
  return std::string::npos;
}

}  // namespace

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string strip_comment(const std::string& line) {
  for (size_t i = 0; i < line.size();) {
    if (line[i] == '"' || line[i] == '\'') {
      const size_t end = skip_string(line, i);
      if (end == std::string::npos) return line;  // unterminated: let the value parser say so
      i = end;
    } else if (line[i] == '#') {
      return line.substr(0, i);
    } else {
      ++i;
    }
  }
  return line;
}

bool looks_like_string(const std::string& text) {
  return !text.empty() && (text.front() == '"' || text.front() == '\'');
}

std::string parse_string(const std::string& text) {
  if (!looks_like_string(text)) throw std::invalid_argument("not a string (TOML strings are \"...\")");
  const size_t end = skip_string(text, 0);
  if (end == std::string::npos) throw std::invalid_argument("unterminated string " + text);
  if (end != text.size())
    throw std::invalid_argument("unexpected text '" + text.substr(end) + "' after the closing quote");
  const std::string body = text.substr(1, end - 2);
  if (body.find('\n') != std::string::npos) throw std::invalid_argument("newline inside a string");
  if (text.front() == '\'') return body;  // literal string: no escapes

  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\') {
      out += body[i];
      continue;
    }
    if (++i >= body.size()) throw std::invalid_argument("unterminated string " + text);
    switch (body[i]) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case 'b': out += '\b'; break;
      case 't': out += '\t'; break;
      case 'n': out += '\n'; break;
      case 'f': out += '\f'; break;
      case 'r': out += '\r'; break;
      case 'u':
      case 'U': {
        const size_t n = body[i] == 'u' ? 4 : 8;
        const std::string hex = body.substr(i + 1, n);
        uint32_t cp = 0;
        auto [p, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), cp, 16);
        if (hex.size() != n || ec != std::errc() || p != hex.data() + hex.size() || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
          throw std::invalid_argument("bad unicode escape \\" + body.substr(i, n + 1) + " in string " + text);
        append_utf8(out, cp);
        i += n;
        break;
      }
      default:
        throw std::invalid_argument(std::string("unknown escape \\") + body[i] + " in string " + text +
                                    " (use '...' for backslashes taken literally)");
    }
  }
  return out;
}

std::string quote(const std::string& s, bool escape_hash) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7F || (escape_hash && c == '#')) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", unsigned(c));
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  return out + "\"";
}

std::optional<int64_t> parse_int(const std::string& text) {
  size_t i = 0;
  std::string clean;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) clean += text[i++];
  const auto d = digits(text, i);
  if (!d || i != text.size() || (d->size() > 1 && (*d)[0] == '0')) return std::nullopt;
  clean += *d;
  int64_t v = 0;
  const char* b = clean.data() + (clean[0] == '+' ? 1 : 0);
  auto [p, ec] = std::from_chars(b, clean.data() + clean.size(), v);
  if (ec != std::errc() || p != clean.data() + clean.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& text) {
  size_t i = 0;
  std::string clean;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) clean += text[i++];
  const auto whole = digits(text, i);
  if (!whole || (whole->size() > 1 && (*whole)[0] == '0')) return std::nullopt;
  clean += *whole;
  if (i < text.size() && text[i] == '.') {
    ++i;
    const auto frac = digits(text, i);
    if (!frac) return std::nullopt;  // TOML wants a digit after the point
    clean += "." + *frac;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    clean += 'e';
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) clean += text[i++];
    const auto exp = digits(text, i);
    if (!exp) return std::nullopt;
    clean += *exp;
  }
  if (i != text.size()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  return std::nullopt;
}

std::string format_float(double v) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general);  // shortest round trip
  std::string s(buf, ec == std::errc() ? p : buf);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep TOML floats floats
  return s;
}

std::vector<std::string> split_array(const std::string& text, bool allow_nested) {
  const std::string t = trim(text);
  if (t.size() < 2 || t.front() != '[' || t.back() != ']')
    throw std::invalid_argument("malformed array " + t + " (flat arrays are [a, b] on one line)");
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;  // brackets open inside the outer array (allow_nested only)
  const std::string body = t.substr(1, t.size() - 2);
  for (size_t i = 0; i < body.size();) {
    const char c = body[i];
    if (c == '"' || c == '\'') {
      const size_t end = skip_string(body, i);
      if (end == std::string::npos) throw std::invalid_argument("unterminated string in array " + t);
      cur += body.substr(i, end - i);
      i = end;
      continue;
    }
    if ((c == '[' || c == ']') && !allow_nested)
      throw std::invalid_argument("nested array in " + t + " (only flat arrays are allowed)");
    if (c == '[' || c == ']') {
      depth += c == '[' ? 1 : -1;
      if (depth < 0 || depth > 1) throw std::invalid_argument("malformed array " + t + " (arrays nest one level deep)");
      cur += c;
    } else if (c == ',' && depth == 0) {
      if (trim(cur).empty()) throw std::invalid_argument("empty item in array " + t);
      items.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
    ++i;
  }
  if (depth != 0) throw std::invalid_argument("malformed array " + t + " (unbalanced brackets)");
  if (!trim(cur).empty()) items.push_back(trim(cur));  // else empty array or a trailing comma
  return items;
}

}  // namespace meshtrain::toml
