#include "topology/hostlist.hpp"

#include <cstdio>
#include <stdexcept>

namespace meshtrain {

namespace {

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// Values of one bracket body, e.g. "001-016,020".
std::vector<std::string> expand_body(const std::string& body, const std::string& expr) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    if (comma == std::string::npos) comma = body.size();
    const std::string item = body.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      if (!all_digits(item)) throw std::invalid_argument("'" + expr + "': '" + item + "' is not a number");
      out.push_back(item);
    } else {
      const std::string lo = item.substr(0, dash), hi = item.substr(dash + 1);
      if (!all_digits(lo) || !all_digits(hi)) throw std::invalid_argument("'" + expr + "': malformed range '" + item + "'");
      const long a = std::stol(lo), b = std::stol(hi);
      if (b < a) throw std::invalid_argument("'" + expr + "': descending range '" + item + "'");
      if (b - a > 1000000) throw std::invalid_argument("'" + expr + "': range '" + item + "' is too large");
      const int width = lo.size() > 1 && lo[0] == '0' ? int(lo.size()) : 0;
      for (long v = a; v <= b; ++v) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%0*ld", width, v);
        out.push_back(buf);
      }
    }
    pos = comma + 1;
  }
  return out;
}

// Splits a list at commas that are outside brackets.
std::vector<std::string> split_top(const std::string& expr) {
  std::vector<std::string> parts;
  int depth = 0;
  std::string cur;
  for (char c : expr) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) throw std::invalid_argument("'" + expr + "': unbalanced ']'");
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw std::invalid_argument("'" + expr + "': unbalanced '['");
  parts.push_back(cur);
  return parts;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& expr) {
  std::vector<std::string> out;
  for (const std::string& part : split_top(expr)) {
    if (part.empty()) throw std::invalid_argument("'" + expr + "': empty host name");
    std::vector<std::string> names{""};
    size_t pos = 0;
    while (pos < part.size()) {
      const size_t open = part.find('[', pos);
      const std::string prefix = part.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
      for (auto& n : names) n += prefix;
      if (open == std::string::npos) break;
      const size_t close = part.find(']', open);
      if (close == std::string::npos) throw std::invalid_argument("'" + expr + "': unbalanced '['");
      const auto values = expand_body(part.substr(open + 1, close - open - 1), expr);
      std::vector<std::string> next;
      for (const auto& n : names)
        for (const auto& v : values) next.push_back(n + v);
      names.swap(next);
      pos = close + 1;
    }
    out.insert(out.end(), names.begin(), names.end());
  }
  return out;
}

}  // namespace meshtrain
