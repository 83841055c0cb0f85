#pragma once
/// @file Deck + command-line parsing into a JobConfig (DESIGN.md data flow step 1).
#include <string>
#include <vector>

#include "config/job_config.hpp"

namespace meshtrain {

/// Reads the deck at `deck_path` (a TOML subset: `[section]`, `key = value` with strings "...",
/// integers, floats, booleans, flat arrays [a, b], `#` comments) with Boost.Program_options, then
/// applies `overrides` (`--section.key=value` or `--section.key value`; the command line wins).
/// Every key is checked against the option registry for existence, type and range.
/// @throws ConfigError, one line: `FILE:LINE: [section] key: what is wrong (rule)` (or
///         `command line: [section] key: ...`): unknown key (with the nearest valid key), unknown
///         or missing section, duplicate key, malformed line, wrong type, value out of range, or
///         `FILE: cannot read deck (reason)`.
JobConfig load_job_config(const std::string& deck_path, const std::vector<std::string>& overrides);

/// Every registered key with its resolved value, as a deck that load_job_config() reads back to
/// the same JobConfig (written to deck.resolved.toml by the trainer).
std::string resolved_deck_toml(const JobConfig& cfg);

}  // namespace meshtrain
