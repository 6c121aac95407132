// SHA-256 of bytes, as lowercase hex (OpenSSL). The cache's checksums and build hashes.
#pragma once

#include <string>
#include <string_view>

namespace kdajit {

std::string sha256_hex(std::string_view bytes);

}  // namespace kdajit
