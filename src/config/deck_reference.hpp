#pragma once
/// @file The deck reference rendered from the option registry: what `meshtrain deck reference`
/// prints and what doc/deck-reference.md holds (a test keeps the two equal).
#include <cstddef>
#include <string>

namespace meshtrain {

/// Every key grouped by section as plain text: key, type, default, allowed values, meaning.
/// Throws nothing.
std::string deck_reference_text();

/// The same as Markdown: a generated-file header, then one table per section with the columns
/// key, type, default, allowed, meaning. This is doc/deck-reference.md byte for byte.
/// Throws nothing.
std::string deck_reference_markdown();

/// `s` as one Markdown table cell: '|' escaped (it would end the cell), '<' as &lt; (it could
/// open an HTML tag). Shared with the TorchTitan compatibility table. Throws nothing.
std::string markdown_cell(const std::string& s);
/// `s` padded with blanks on the right to `width` characters (unchanged when longer), for the
/// plain-text tables. Throws nothing.
std::string pad_right(const std::string& s, size_t width);

}  // namespace meshtrain
