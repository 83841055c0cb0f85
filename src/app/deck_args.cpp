#include "app/deck_args.hpp"

#include <charconv>

#include "util/errors.hpp"

namespace meshtrain::app {

DeckArgs parse_deck_args(int argc, char** argv, const std::set<std::string>& valued) {
  DeckArgs out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i], value;
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    const bool ours = name == "--deck" || name == "--world-size" || valued.count(name);
    if (!ours) {
      out.overrides.push_back(a);
      continue;
    }
    if (eq != std::string::npos) value = a.substr(eq + 1);
    else if (i + 1 < argc) value = argv[++i];
    else throw ConfigError("command line: " + name + " needs a value");
    if (name == "--deck") {
      out.deck = value;
    } else if (name == "--world-size") {
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), out.world_size);
      if (ec != std::errc() || p != value.data() + value.size() || out.world_size < 1)
        throw ConfigError("command line: --world-size: expected a positive integer, got " + value);
    } else {
      out.values[name] = value;
    }
  }
  return out;
}

}  // namespace meshtrain::app
