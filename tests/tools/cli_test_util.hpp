// Running the `kdajit` binary in tests: a clean kdajit environment plus the
// test's variables, stdout and stderr captured in files, a time limit.
#pragma once

#include <csignal>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cache_test_util.hpp"
#include "catch.hpp"

#ifndef KDAJIT_CLI
#error "KDAJIT_CLI must name the kdajit binary"
#endif

namespace kdajit::test {

struct Run {
  int code = -1;  // exit code; 128 + signal; -2 when killed for running past the limit
  std::string out, err;
};

// Starts `kdajit args...` with every KDAJIT_* variable unset, KDAJIT_LOG=info, plus
// `env` (a value of "\x01unset" unsets); stdout and stderr go to files under `dir`.
// `stderr_fd` >= 0: stderr goes there instead (a terminal). `exe`: the binary.
inline pid_t start_cli(const std::vector<std::string>& args, const std::string& dir, const std::string& tag,
                       const std::map<std::string, std::string>& env = {}, int stderr_fd = -1,
                       const std::string& exe = KDAJIT_CLI) {
  std::string out = dir + "/" + tag + ".out", err = dir + "/" + tag + ".err";
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid == 0) {
    for (const char* v : {"KDAJIT_CACHE_DIR", "KDAJIT_DISABLE_JIT", "KDAJIT_CACHE_MAX_BYTES", "KDAJIT_ARCH"}) ::unsetenv(v);
    ::setenv("KDAJIT_LOG", "info", 1);
    for (const auto& [k, v] : env) {
      if (v == "\x01unset") ::unsetenv(k.c_str());
      else ::setenv(k.c_str(), v.c_str(), 1);
    }
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = stderr_fd >= 0 ? stderr_fd : ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> argv;
    std::string program = exe;
    argv.push_back(program.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

// Waits at most `limit_s` seconds, then kills the child (code -2).
inline Run finish_cli(pid_t pid, const std::string& dir, const std::string& tag, int limit_s = 300) {
  Run r;
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
  while (true) {
    pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.code = -2;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (r.code != -2) r.code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  r.out = read_text(dir + "/" + tag + ".out");
  r.err = read_text(dir + "/" + tag + ".err");
  return r;
}

inline Run cli(const std::vector<std::string>& args, const std::string& dir,
               const std::map<std::string, std::string>& env = {}, int limit_s = 300) {
  static int n = 0;
  std::string tag = fmt::format("run{}", n++);
  return finish_cli(start_cli(args, dir, tag, env), dir, tag, limit_s);
}

inline nlohmann::json parse_json(const Run& r) {
  INFO(r.out << r.err);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  REQUIRE(!j.is_discarded());
  return j;
}

inline std::string name_of(const char* state, int heads, int t) {
  return fmt::format("kda_packed.h{}.state_{}.conv_ds.t{}.gate_bounded.route_rowcta.sm_90", heads, state, t);
}

}  // namespace kdajit::test
