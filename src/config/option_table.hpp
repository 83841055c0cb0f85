#pragma once
/// @file Internal to config/: the registry's entries, one per JobConfig field (option_table.cpp).
#include <vector>

#include "config/option_registry.hpp"

namespace meshtrain {

/// Builds every Option in reference order (section by section). Called once by
/// option_registry(); throws nothing.
std::vector<Option> build_option_table();

}  // namespace meshtrain
