// What the verbs print: escaped echoes, sizes and times, tables, JSON that stays
// valid whatever bytes a file name holds, and the prewarm progress lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kdajit::cli {

// `s` quoted for a message: printable (env.hpp) and at most `max_bytes` of it.
std::string quote(std::string_view s, size_t max_bytes = 120);

// `kdajit: error: <message>` on stderr (one line, printable), then each line of
// `detail` (a compile log) indented, so that none of it reads as a kdajit line.
void print_error(std::string_view message, std::string_view detail = {});

// A string for JSON output: valid UTF-8 stays as it is; otherwise invalid bytes
// become \xNN escapes (a file name in a root may be any bytes).
std::string json_text(std::string_view s);
std::vector<std::string> json_texts(const std::vector<std::string>& v);
// j.dump(2), never throwing on bad UTF-8 (replaced).
std::string dump_json(const nlohmann::json& j);

std::string human_bytes(uint64_t n);
std::string utc_time(int64_t ns);  // "2024-05-01 10:00:00", "-" for 0
std::string iso_time(int64_t ns);  // "2024-05-01T10:00:00Z", "" for 0

// Left-aligned columns, two spaces apart; every cell is made printable.
void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

// One line per key on stderr, `[i/N] <text>`, printed once when the key is done
// (the same on a terminal and in a log). Long runs (8 keys or more, or 10 s) get
// an ETA from the average time per key so far.
class Progress {
 public:
  explicit Progress(size_t total);
  void report(const std::string& text);

 private:
  size_t total_;
  size_t done_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
};

}  // namespace kdajit::cli
