#pragma once
/// @file The byte-level alphabet of GPT-2 style BPE tokenizers (Radford et al. 2019, "Language
/// Models are Unsupervised Multitask Learners"; Hugging Face tokenizers' ByteLevel pre-tokenizer
/// and decoder): each of the 256 byte values is shown as one printable Unicode character, so
/// tokenizer.json can write byte strings as text. Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand
/// for themselves; the other 68 map, in byte order, to U+0100, U+0101, ... (space 0x20 -> U+0120 'Ġ').
#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace meshtrain {

/// The code point that stands for byte `b` (0 <= b < 256).
char32_t byte_level_char(unsigned char b);

/// Raw bytes of a vocabulary entry written in the byte-level alphabet (a tokenizer.json
/// vocabulary key or merge side); std::nullopt when `text` is not valid UTF-8 or holds a
/// character outside the alphabet (such entries can only be added tokens).
std::optional<std::string> byte_level_to_bytes(std::string_view text);

/// The byte-level spelling (UTF-8) of raw `bytes`; inverse of byte_level_to_bytes.
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace meshtrain
