#include "cli_output.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>

#include <fmt/format.h>

#include "kdajit/env.hpp"
#include "kdajit/log.hpp"

namespace kdajit::cli {

std::string quote(std::string_view s, size_t max_bytes) { return printable(s, max_bytes); }

namespace {
void write_stderr(const std::string& s) {
  ssize_t off = 0;
  while (off < static_cast<ssize_t>(s.size())) {
    ssize_t n = ::write(STDERR_FILENO, s.data() + off, s.size() - off);
    if (n <= 0) break;
    off += n;
  }
}
}  // namespace

void print_error(std::string_view message, std::string_view detail) {
  std::string out = "kdajit: error: " + printable_line(message, 2000) + "\n";
  size_t start = 0;
  while (start < detail.size()) {
    size_t nl = detail.find('\n', start);
    if (nl == std::string_view::npos) nl = detail.size();
    out += "  " + printable_line(detail.substr(start, nl - start), 4096) + "\n";
    start = nl + 1;
  }
  std::fflush(stderr);
  write_stderr(out);
}

std::string json_text(std::string_view s) {
  // printable() keeps valid UTF-8 and escapes the rest; only bytes that are not
  // UTF-8 need escaping for JSON (the dump escapes control characters itself).
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size() && static_cast<unsigned char>(s[j]) < 0x80) ++j;
    out.append(s.substr(i, j - i));
    if (j == s.size()) break;
    // A run of non-ASCII bytes: keep it when it is valid UTF-8.
    size_t k = j;
    while (k < s.size() && static_cast<unsigned char>(s[k]) >= 0x80) ++k;
    std::string_view run = s.substr(j, k - j);
    std::string shown = printable(run, run.size());
    out += shown;
    i = k;
  }
  return out;
}

std::vector<std::string> json_texts(const std::vector<std::string>& v) {
  std::vector<std::string> out;
  out.reserve(v.size());
  for (const auto& s : v) out.push_back(json_text(s));
  return out;
}

std::string dump_json(const nlohmann::json& j) { return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string human_bytes(uint64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string utc_time(int64_t ns) {
  if (ns <= 0) return "-";
  std::time_t secs = static_cast<std::time_t>(ns / 1000000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02} {:02}:{:02}:{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec);
}

std::string iso_time(int64_t ns) {
  if (ns <= 0) return {};
  std::string t = utc_time(ns);
  t[10] = 'T';
  return t + "Z";
}

void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows_in) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : rows_in) {
    std::vector<std::string> cells;
    for (const auto& c : r) cells.push_back(printable_line(c, 4096));
    rows.push_back(std::move(cells));
  }
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (size_t c = 0; c < r.size(); ++c) {
      s += r[c];
      if (c + 1 < r.size()) s += std::string(width[c] - r[c].size() + 2, ' ');
    }
    fmt::print("{}\n", s);
  };
  line(header);
  for (const auto& r : rows) line(r);
}

Progress::Progress(size_t total) : total_(total), start_(std::chrono::steady_clock::now()) {}

void Progress::report(const std::string& text) {
  if (log_level() == LogLevel::quiet) return;
  std::lock_guard<std::mutex> g(mu_);
  ++done_;
  std::string line = fmt::format("[{}/{}] {}", done_, total_, printable_line(text, 4096));
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (done_ < total_ && (total_ >= 8 || elapsed >= 10)) {
    const double eta = elapsed / static_cast<double>(done_) * static_cast<double>(total_ - done_);
    line += fmt::format("  ETA {:.0f} s", eta);
  }
  line.push_back('\n');
  write_stderr(line);  // one write() per line: lines of parallel workers never interleave
}

}  // namespace kdajit::cli
