#include "kdajit/bounded_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include <fmt/format.h>

#include "kdajit/env.hpp"

namespace kdajit {

Result<std::string> read_regular_file(const std::string& path, size_t max_bytes, std::string_view what) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return invalid_argument(fmt::format("{}: cannot open: {}", what, std::generic_category().message(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const char* kind = S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode) ? "a character device"
                       : S_ISBLK(st.st_mode) ? "a block device"
                       : S_ISDIR(st.st_mode) ? "a directory"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    ::close(fd);
    return invalid_argument(fmt::format("{}: expected a regular file, got {}", what, kind));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return invalid_argument(fmt::format("{}: expected at most {} bytes, got {}", what, max_bytes, st.st_size));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return invalid_argument(fmt::format("{}: cannot read: {}", what, std::generic_category().message(e)));
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes) {  // it grew while being read
      ::close(fd);
      return invalid_argument(fmt::format("{}: expected at most {} bytes", what, max_bytes));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Result<nlohmann::json> parse_json_bounded(std::string_view text, int max_depth) {
  // A scan for the nesting depth first: the parser itself copes with any depth, but
  // dumping, comparing or destroying a deep value recurses.
  int depth = 0, line = 1, column = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    ++column;
    if (c == '\n') {
      ++line;
      column = 0;
    }
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return invalid_argument(fmt::format("nested deeper than {} levels at line {}, column {}", max_depth, line, column));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " tag.
    if (auto close = what.find("] "); close != std::string::npos) what = what.substr(close + 2);
    return invalid_argument(printable(what, 200));
  }
}

}  // namespace kdajit
