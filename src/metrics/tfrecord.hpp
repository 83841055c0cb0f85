#pragma once
/// @file TFRecord framing, the container of TensorBoard event files (TensorFlow's
/// tensorflow/core/lib/io/record_writer.h; the checksum is tensorflow/core/lib/hash/crc32c.h's
/// masked CRC-32C). One record is
///
///     uint64 length (little-endian) | uint32 masked_crc32c(the 8 length bytes) |
///     data[length] | uint32 masked_crc32c(data)
///
/// with masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2^32), c = CRC-32C(x)
/// (Castagnoli polynomial 0x1EDC6F41, reflected, initial and final XOR 0xFFFFFFFF — RFC 3720
/// §12.1). The mask keeps a CRC of data that itself contains CRCs from being trivially related.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace meshtrain {

/// CRC-32C of `bytes` (Boost.CRC). crc32c("123456789") == 0xE3069283. Throws nothing.
uint32_t crc32c(std::string_view bytes);

/// TensorFlow's masked CRC-32C: ((c >> 15) | (c << 17)) + 0xa282ead8, c = crc32c(bytes). Throws nothing.
uint32_t masked_crc32c(std::string_view bytes);

/// One TFRecord: the header (12 bytes), `data`, the footer (4 bytes); all integers little-endian.
/// Throws std::bad_alloc only.
std::string tfrecord_frame(std::string_view data);

}  // namespace meshtrain
