// The typed environment: every KDAJIT_* variable parsed and checked in one place,
// the cache-layer list, and the escaping of echoed text in messages and log lines.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "kdajit/env.hpp"
#include "kdajit/log.hpp"

using namespace kdajit;

namespace {

// Sets variables for one test and restores them afterwards.
struct ScopedEnv {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  ScopedEnv() {
    for (auto v : kEnvironmentVariables) set(std::string(v).c_str(), nullptr);
  }
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }
};

std::string error_of(const Result<Environment>& r) {
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::invalid_argument);
  return r.error().message;
}

bool contains(const std::string& s, std::string_view needle) { return s.find(needle) != std::string::npos; }

}  // namespace

TEST_CASE("environment: KDAJIT_ARCH is typed and validated", "[env]") {
  ScopedEnv env;
  auto none = read_environment();
  REQUIRE(none.ok());
  CHECK(!none->arch.has_value());
  for (const char* a : {"sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"}) {
    env.set("KDAJIT_ARCH", a);
    auto r = read_environment();
    REQUIRE(r.ok());
    REQUIRE(r->arch.has_value());
    CHECK(to_string(*r->arch) == a);
  }
  env.set("KDAJIT_ARCH", "sm_89");
  CHECK(error_of(read_environment()) ==
        "KDAJIT_ARCH: expected one of sm_90|sm_90a|sm_100a|sm_103a|sm_120a, got 'sm_89'");
}

TEST_CASE("environment: malformed values name the variable and the expected value", "[env]") {
  ScopedEnv env;
  SECTION("KDAJIT_LOG") {
    env.set("KDAJIT_LOG", "loud");
    CHECK(error_of(read_environment()) == "KDAJIT_LOG: expected quiet|info|debug, got 'loud'");
  }
  SECTION("KDAJIT_CACHE_MAX_BYTES") {
    env.set("KDAJIT_CACHE_MAX_BYTES", "10GB");
    CHECK(contains(error_of(read_environment()), "KDAJIT_CACHE_MAX_BYTES: expected a byte count"));
  }
  SECTION("KDAJIT_DISABLE_JIT") {
    env.set("KDAJIT_DISABLE_JIT", "yes");
    CHECK(error_of(read_environment()) == "KDAJIT_DISABLE_JIT: expected 0 or 1, got 'yes'");
  }
  SECTION("KDAJIT_CACHE_DIR with an empty layer") {
    env.set("KDAJIT_CACHE_DIR", "/a::/b");
    CHECK(contains(error_of(read_environment()), "KDAJIT_CACHE_DIR: expected a directory or a ':'-separated list"));
  }
  SECTION("a value with control characters is echoed escaped") {
    env.set("KDAJIT_LOG", "x\nkdajit: compiled fake\x1b[2K");
    std::string msg = error_of(read_environment());
    CHECK(msg.find('\n') == std::string::npos);
    CHECK(msg.find('\x1b') == std::string::npos);
    CHECK(contains(msg, "got 'x\\nkdajit: compiled fake\\x1b[2K'"));
  }
}

TEST_CASE("environment: the cache setting is a list of layers", "[env]") {
  auto one = split_cache_layers("/srv/cache", "X");
  REQUIRE(one.ok());
  CHECK(*one == std::vector<std::string>{"/srv/cache"});
  auto two = split_cache_layers("/opt/kdajit:/home/u/.cache/kdajit", "X");
  REQUIRE(two.ok());
  CHECK(*two == std::vector<std::string>{"/opt/kdajit", "/home/u/.cache/kdajit"});
  for (const char* bad : {"", ":", "/a:", ":/a", "/a::/b"}) {
    INFO(bad);
    auto r = split_cache_layers(bad, "--cache-dir");
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().message, "--cache-dir: expected a directory"));
  }

  ScopedEnv env;
  env.set("HOME", "/home/u");
  env.set("XDG_CACHE_HOME", nullptr);
  auto e = read_environment();
  REQUIRE(e.ok());
  CHECK(default_cache_root(*e) == "/home/u/.cache/kdajit");
  CHECK(default_cache_root_source(*e) == "HOME");
  env.set("XDG_CACHE_HOME", "/xdg");
  e = read_environment();
  CHECK(default_cache_root(*e) == "/xdg/kdajit");
  CHECK(default_cache_root_source(*e) == "XDG_CACHE_HOME");
  env.set("KDAJIT_CACHE_DIR", "/sys-layer:/mine");
  e = read_environment();
  CHECK(default_cache_root(*e) == "/sys-layer:/mine");
  CHECK(default_cache_root_source(*e) == "KDAJIT_CACHE_DIR");
}

TEST_CASE("printable: control bytes, ANSI, NUL, bad UTF-8 and length", "[env][escape]") {
  CHECK(printable("kda_single.h64") == "kda_single.h64");
  CHECK(printable("a\nb\rc\td") == "a\\nb\\rc\\td");
  CHECK(printable("\x1b[31mred") == "\\x1b[31mred");
  CHECK(printable(std::string("nul\0cut", 7)) == "nul\\x00cut");
  CHECK(printable("\x7f") == "\\x7f");
  CHECK(printable("caf\xc3\xa9") == "caf\xc3\xa9");                // valid UTF-8 stays
  CHECK(printable("bad\xff\xc3") == "bad\\xff\\xc3");              // invalid bytes are escaped
  CHECK(printable("\xc2\x9b" "2J") == "\\u009b2J");                // C1 CSI
  CHECK(printable("\xe2\x80\xae" "txt") == "\\u202etxt");          // bidi override
  CHECK(printable(std::string(1000, 'k'), 10) == "kkkkkkkkkk...(990 more bytes)");
  CHECK(printable("ab\xc3\xa9", 3) == "ab...(2 more bytes)");      // never half a character
  CHECK(printable("a\\x1b") == "a\\\\x1b");                          // a backslash is escaped itself
}

TEST_CASE("printable_line: one escaping layer, both ends of a long message", "[env][escape]") {
  // The quoted input was escaped already: backslashes stay, control bytes do not.
  CHECK(printable_line("got '" + printable("\\x1b") + "'") == "got '\\\\x1b'");  // a literal backslash
  CHECK(printable_line("got '" + printable("\x1b[") + "' and \x1b") == "got '\\x1b[' and \\x1b");  // ESC
  const std::string msg = "cache root /" + std::string(5000, 'd') + " cannot be opened: File name too long";
  const std::string shown = printable_line(msg, 2000);
  CHECK(shown.size() < 2100);
  CHECK(shown.rfind("cache root /ddd", 0) == 0);
  CHECK(shown.find("...(") != std::string::npos);
  CHECK(shown.size() - shown.rfind(" cannot be opened: File name too long") == 37);
}

TEST_CASE("byte counts: decimal digits only, one parser for every setting", "[env]") {
  CHECK(*parse_byte_count("0", "X") == 0);
  CHECK(*parse_byte_count("18446744073709551615", "X") == UINT64_MAX);
  for (const char* bad : {"", "-0", "-5", "+5", "0x10", " 5", "5 ", "1e3", "5k", "18446744073709551616"}) {
    INFO("'" << bad << "'");
    auto r = parse_byte_count(bad, "prune --max-bytes");
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message == "prune --max-bytes: expected a byte count (decimal digits, 0..18446744073709551615), "
                               "got '" + std::string(bad) + "'");
  }
  ScopedEnv env;
  env.set("KDAJIT_CACHE_MAX_BYTES", "-0");
  CHECK_FALSE(read_environment().ok());
}

TEST_CASE("log lines are single lines whatever the message echoes", "[env][escape]") {
  char templ[] = "/tmp/kdajit-log.XXXXXX";
  int fd = ::mkstemp(templ);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  int saved = ::dup(2);
  ::dup2(fd, 2);
  set_log_level(LogLevel::info);
  log_warning("cache entry {} is unusable", "x\nkdajit: compiled fake\x1b[1A");
  ::dup2(saved, 2);
  ::close(saved);
  ::lseek(fd, 0, SEEK_SET);
  std::string text(4096, '\0');
  text.resize(static_cast<size_t>(::read(fd, text.data(), text.size())));
  ::close(fd);
  ::unlink(templ);
  CHECK(text == "kdajit: warning: cache entry x\\nkdajit: compiled fake\\x1b[1A is unusable\n");
}
