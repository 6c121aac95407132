// Registers Catch2 test cases with names made at run time (one per kernel key),
// so a failure names its key and `test_x "<key name>"` runs just that one.
// Works with Catch2 2.x and 3.x.
#pragma once

#include <deque>
#include <functional>
#include <string>

#include "catch.hpp"

namespace kdajit::test {

class FunctionInvoker : public Catch::ITestInvoker {
 public:
  explicit FunctionInvoker(std::function<void()> fn) : fn_(std::move(fn)) {}
  void invoke() const override { fn_(); }

 private:
  std::function<void()> fn_;
};

// Call before Catch::Session().run() (e.g. from a static initialiser).
inline void register_test(std::string name, std::string tags, std::function<void()> fn) {
  // Catch keeps StringRefs: the strings must live as long as the process.
  static std::deque<std::string> storage;
  storage.push_back(std::move(name));
  const std::string& n = storage.back();
  storage.push_back(std::move(tags));
  const std::string& t = storage.back();
#if defined(KDAJIT_CATCH2_V3)
  Catch::AutoReg reg(Catch::Detail::unique_ptr<Catch::ITestInvoker>(new FunctionInvoker(std::move(fn))),
                     CATCH_INTERNAL_LINEINFO, Catch::StringRef(), Catch::NameAndTags{n, t});
#else
  Catch::AutoReg reg(new FunctionInvoker(std::move(fn)), CATCH_INTERNAL_LINEINFO, Catch::StringRef(),
                     Catch::NameAndTags{n, t});
#endif
}

}  // namespace kdajit::test
