#pragma once
/// @file Command-line arguments shared by the subcommands that read a deck (train, deck check,
/// layout): `--deck FILE`, `--world-size N`, the subcommand's own valued options, and every
/// other argument as a deck override (`--section.key=value` or `--section.key value`).
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace meshtrain::app {

struct DeckArgs {
  std::string deck;                           ///< --deck FILE ("" when absent)
  int64_t world_size = -1;                    ///< --world-size N (-1 when absent)
  std::map<std::string, std::string> values;  ///< the subcommand's own valued options, e.g. "--csv"
  std::vector<std::string> overrides;         ///< everything else, for load_job_config
};

/// Splits argv. `valued` lists the subcommand's own options that take a value ("--csv").
/// @throws ConfigError when --world-size is not a positive integer or an option lacks its value.
DeckArgs parse_deck_args(int argc, char** argv, const std::set<std::string>& valued = {});

}  // namespace meshtrain::app
