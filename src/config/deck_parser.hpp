#pragma once
/// @file Deck + command-line parsing into a JobConfig (DESIGN.md data flow step 1).
#include <string>
#include <vector>

#include "config/job_config.hpp"

namespace meshtrain {

/// Reads the deck at `deck_path` with Boost.Program_options and applies the command-line
/// `overrides`; the command line wins over the deck, and a key given twice on the command line
/// takes its last value (as argparse does). Keys not given keep JobConfig's defaults.
///
/// The deck is a TOML subset: `[section]` headers (dotted ones such as `[quantize.linear.float8]`
/// too, and `[quantize]` for the tables below it), `key = value` lines (dotted keys
/// `linear.float8.emulate = false` too), `#` comments (whole-line and trailing), strings "..."
/// (with TOML escapes) or '...', integers (`1_000` allowed), finite floats (`3e-4`, `0.1`),
/// booleans `true` / `false` and one-line arrays `[a, b]` (arrays of arrays for TorchTitan's
/// list[list[str]] keys).
/// Overrides are `--section.key=value`, `--section.key value`, or a bare `--section.key` for a
/// boolean (true); their strings need no quotes. Every key is checked against the option
/// registry for existence, type and range; cross-key rules are JobConfig::validate()'s.
/// JobConfig::origins records, per key set, "FILE:LINE" or "command line"; deck_path is kept.
/// TorchTitan's keys then get their outcome (torchtitan_keys.hpp, apply_torchtitan_keys): the
/// lines of JobConfig::notices and JobConfig::refusals (the latter thrown by validate()).
///
/// @throws ConfigError whose what() is one line:
///   `FILE:LINE: [section] key: what is wrong (rule)` for an unknown key (naming the nearest
///   valid one: "unknown key; did you mean 'lr'?"), a duplicate key, a wrong type
///   ("expected integer, got abc"), a value out of range ("value 0 is out of range (must be > 0)");
///   `FILE:LINE: what is wrong` for an unknown or repeated section, a key outside any section or
///   a malformed line; `command line: [section] key: ...` (or `command line: ...`) for the same
///   faults in an override, a stray argument or a missing value; and
///   `FILE: cannot read deck (reason)` for a missing, unreadable or directory deck.
JobConfig load_job_config(const std::string& deck_path, const std::vector<std::string>& overrides);

/// load_job_config() of a deck held in memory (e.g. the resolved deck stored in a checkpoint's
/// /meta); `deck_path` names it in messages and JobConfig::deck_path.
/// @throws ConfigError as load_job_config(), except the "cannot read deck" one.
JobConfig load_job_config_text(const std::string& text, const std::string& deck_path,
                               const std::vector<std::string>& overrides = {});

/// Every registered key with the value `cfg` holds, as a deck that load_job_config() reads back
/// to an equal JobConfig (unset optional keys are written as comments; TorchTitan-only keys only
/// when the run set them, under their own tables). The trainer writes it to
/// `<dump_folder>/deck.resolved.toml`. Throws nothing.
std::string resolved_deck_toml(const JobConfig& cfg);

}  // namespace meshtrain
