#pragma once
/// @file Slurm hostlist expressions: `nid[001-016,020]`, `a[1-2]b[3-4]`, comma-separated lists.
#include <string>
#include <vector>

namespace meshtrain {

/// Expands a Slurm hostlist expression into host names, in order; ranges keep the width of
/// their zero padding (`nid[08-10]` → nid08, nid09, nid10); several bracket groups expand as a
/// cartesian product, left to right.
/// @throws std::invalid_argument describing the malformed part (unbalanced brackets, empty
///         range, descending range, non-numeric bound).
std::vector<std::string> expand_hostlist(const std::string& expr);

}  // namespace meshtrain
