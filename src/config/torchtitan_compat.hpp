#pragma once
/// @file The TorchTitan compatibility table rendered from the option registry: what `meshtrain
/// deck torchtitan` prints and what doc/torchtitan-compat.md holds (a test keeps the two equal).
#include <string>

namespace meshtrain {

/// Every TorchTitan v0.2.2 key grouped by TorchTitan section as plain text: key, type,
/// TorchTitan default, meshtrain default, outcome. Throws nothing.
std::string torchtitan_compat_text();

/// The same as Markdown: a generated-file header and an explanation of the three outcomes, one
/// table per TorchTitan section (columns key, type, TorchTitan default, meshtrain default,
/// outcome), then the meshtrain keys TorchTitan lacks. This is doc/torchtitan-compat.md byte for
/// byte. Throws nothing.
std::string torchtitan_compat_markdown();

}  // namespace meshtrain
