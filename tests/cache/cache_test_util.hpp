// Helpers of the cache tests: scratch roots, stderr capture, forked children and
// a fake build that stands in for NVRTC.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "kdajit/cache.hpp"
#include "kdajit/log.hpp"

namespace kdajit::test {

namespace fs = std::filesystem;

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/kdajit-cache-test.XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) std::abort();
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    // Undo chmods of tests so removal works for non-root users too.
    for (auto it = fs::recursive_directory_iterator(path_, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
      fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
};

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_text(const std::string& path, std::string_view text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// Lines of `text` that start with `prefix`.
inline int count_lines(const std::string& text, std::string_view prefix) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) ++n;
  return n;
}

// Redirects fd 2 into a file until finish(): the cache logs with write(2).
class StderrCapture {
 public:
  StderrCapture() {
    char templ[] = "/tmp/kdajit-stderr.XXXXXX";
    fd_ = ::mkstemp(templ);
    path_ = templ;
    std::fflush(stderr);
    saved_ = ::dup(2);
    ::dup2(fd_, 2);
  }
  std::string finish() {
    if (saved_ >= 0) {
      std::fflush(stderr);
      ::dup2(saved_, 2);
      ::close(saved_);
      saved_ = -1;
      ::close(fd_);
      text_ = read_text(path_);
      ::unlink(path_.c_str());
    }
    return text_;
  }
  ~StderrCapture() { finish(); }

 private:
  int fd_ = -1;
  int saved_ = -1;
  std::string path_;
  std::string text_;
};

// Runs fn in a forked child that exits with fn's return value; returns the pid.
inline pid_t spawn_child(const std::function<int()>& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = fn();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  return pid;
}

// The child's exit code, or 128 + signal.
inline int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

inline void redirect_stderr_to(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  ::dup2(fd, 2);
  ::close(fd);
}

// A deterministic stand-in for NVRTC: source, options and "cubin" derived from the
// key, so that its hash is stable and the checksum test has real bytes to flip.
struct FakeBuild {
  KernelKey key;
  std::string source;
  std::vector<std::string> options;
  std::string nvrtc = "fake-13.0";
  std::string cubin;
  std::string hash;

  explicit FakeBuild(const KernelKey& k, size_t cubin_bytes = 4096) : key(k) {
    source = "// kdajit kernel " + key_name(k) + "\nextern \"C\" __global__ void kda() {}\n";
    options = {"--gpu-architecture=" + std::string(to_string(k.arch)), "-default-device"};
    for (size_t i = 0; cubin.size() < cubin_bytes; ++i) cubin += key_name(k)[i % key_name(k).size()];
    hash = current_build_hash(source, options, k.arch, nvrtc);
  }

  // A BuildFn that counts its calls, optionally sleeping first.
  BuildFn fn(std::atomic<int>* calls = nullptr, int delay_ms = 0) const {
    return [this, calls, delay_ms]() -> Result<CacheBuild> {
      if (calls) ++*calls;
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      CacheBuild b;
      b.source = source;
      b.cubin = cubin;
      b.options = options;
      b.nvrtc_version = nvrtc;
      b.meta = {{"registers", 42}, {"spill_bytes", 0}, {"smem_bytes", 0}, {"stack_bytes", 0}, {"entry", "kda"}};
      return b;
    };
  }
};

// Forks a child that takes an exclusive flock() on `lock_path` (as a live
// writer holding a key's lock would) and returns its pid once it holds it.
// The caller ends it with kill(pid, SIGKILL) and wait_child(pid).
inline pid_t hold_lock_in_child(const std::string& lock_path) {
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t pid = spawn_child([&] {
    int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) return 1;
    char c = 'x';
    if (::write(ready[1], &c, 1) != 1) return 2;
    ::pause();
    return 0;
  });
  // Closed here first, so that a child that fails ends the read with EOF, not a hang.
  ::close(ready[1]);
  char c = 0;
  const ssize_t n = ::read(ready[0], &c, 1);
  ::close(ready[0]);
  REQUIRE(n == 1);
  return pid;
}

// Sets the modification time of `path` (never through a link) `seconds` into the past.
inline void age_path(const std::string& path, int seconds) {
  struct timespec ts[2];
  ::clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[0].tv_sec -= seconds;
  ts[1] = ts[0];
  ::utimensat(AT_FDCWD, path.c_str(), ts, AT_SYMLINK_NOFOLLOW);
}

// The permission bits of `path` itself (a link is not followed), or -1.
inline int mode_of(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777);
}

inline uid_t owner_of(const std::string& path) {
  struct stat st {};
  ::lstat(path.c_str(), &st);
  return st.st_uid;
}

// Runs fn in a forked child as `uid` (group `uid`, no supplementary groups); the
// child exits with fn's return value, or 97 when it could not switch users.
inline pid_t spawn_as(uid_t uid, const std::function<int()>& fn) {
  return spawn_child([uid, fn] {
    if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) return 97;
    return fn();
  });
}

inline KernelKey key_h(int heads, int t = 2, Arch arch = Arch::sm_90) {
  return KernelKey{Op::packed, heads, StateDtype::bf16, ConvLayout::ds, t, Gate::bounded, Route::rowcta, arch};
}

// Cache options for a test root: JIT on whatever the environment says.
inline CacheOptions opts(const std::string& root) {
  CacheOptions o;
  o.root = root;
  o.disable_jit = false;
  return o;
}

// Every test sees info-level logs, whatever KDAJIT_LOG the CI sets.
struct LogLevelInfo {
  LogLevelInfo() { set_log_level(LogLevel::info); }
};
inline const LogLevelInfo g_log_level_info;

}  // namespace kdajit::test
