// main() of tests that need two users: they run as root and switch a forked child
// to another uid. Exit 77 (CTest SKIP_RETURN_CODE) when that is impossible: not
// root, or no CAP_SETUID (some containers).
#define CATCH_CONFIG_RUNNER
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "catch.hpp"

namespace {

bool can_switch_users() {
  if (::geteuid() != 0) return false;
  pid_t pid = ::fork();
  if (pid == 0) _exit(::setgroups(0, nullptr) == 0 && ::setgid(65534) == 0 && ::setuid(65534) == 0 ? 0 : 1);
  int status = 0;
  return pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (!can_switch_users()) {
    std::fprintf(stderr, "cannot run as root and switch a child to uid 65534: skipping the two-user tests\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
