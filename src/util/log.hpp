#pragma once
/// @file Logging through spdlog: rank 0 prints progress; errors from any rank carry
/// `[rank R host]` (DESIGN.md, Conventions).
#include <spdlog/spdlog.h>

#include <string>

namespace meshtrain::log {

/// Sets this process's rank and host (prefix of every line) and whether info lines print
/// (only on rank 0 by default).
void init(int rank, const std::string& host, bool verbose_all_ranks = false);
/// Progress line, printed on rank 0 only.
void info(const std::string& msg);
/// Warning, printed on every rank with its rank prefix.
void warn(const std::string& msg);
/// Error, printed on every rank with its rank prefix.
void error(const std::string& msg);

}  // namespace meshtrain::log
