// The C ABI of libkdajit.so as a C caller sees it: statuses and messages for
// bad pointers and out-of-range enum values (read as integers, never as C++
// enums), the configuration -> key questions, pre-warming without a GPU, the
// generated version, and a library that does not link NVRTC.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <cstring>
#include <filesystem>
#include <string>

#include "catch.hpp"
#include "decode_args_builder.hpp"
#include "prefill_args_builder.hpp"
#include "kdajit/kdajit.h"
#include "kdajit/kdajit_version.h"
#include "kdajit/runtime/api/sized_struct.hpp"

using kdajit::test::build_args;
using kdajit::test::CallConfig;
using kdajit::test::build_prefill_args;
using kdajit::test::PrefillConfig;

// A global operator new that throws std::bad_alloc while armed: it replaces the
// one libkdajit.so calls too, so an allocation failure inside the library can
// be provoked from here.
namespace {
std::atomic<bool> g_fail_allocations{false};
}  // namespace
void* operator new(std::size_t n) {
  if (g_fail_allocations.load(std::memory_order_relaxed)) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

// Writes an arbitrary integer into a C enum field, as a C caller can.
template <class E>
void set_raw(E& field, int32_t v) {
  static_assert(sizeof(E) == sizeof(int32_t));
  std::memcpy(&field, &v, sizeof v);
}

std::string last_error() { return kdajit_last_error(); }

// A quiet runtime whose kernel cache is the directory `cache_dir`.
kdajit_runtime_t* quiet_runtime(const std::string& cache_dir) {
  kdajit_runtime_options_t o;
  kdajit_runtime_options_init(&o);
  o.cache_dir = cache_dir.c_str();
  o.log_level = KDAJIT_LOG_QUIET;
  kdajit_runtime_t* rt = nullptr;
  REQUIRE(kdajit_runtime_create(&o, &rt) == KDAJIT_OK);
  return rt;
}

TEST_CASE("c api: the version comes from the project", "[c_api]") {
  CHECK(std::string(kdajit_version()) == KDAJIT_VERSION_STRING);
  CHECK(std::string(KDAJIT_VERSION_STRING) ==
        std::to_string(KDAJIT_VERSION_MAJOR) + "." + std::to_string(KDAJIT_VERSION_MINOR) + "." +
            std::to_string(KDAJIT_VERSION_PATCH));
}

TEST_CASE("c api: NULL pointers are statuses with messages", "[c_api]") {
  kdajit_decode_args_t a;
  kdajit_decode_args_init(&a);
  CHECK(kdajit_single_decode(nullptr, &a, nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("runtime: expected a runtime") != std::string::npos);
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("args: expected") != std::string::npos);
  CHECK(kdajit_runtime_create(nullptr, nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(kdajit_query_support(nullptr, nullptr, 0) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(kdajit_config_key(nullptr, 1, nullptr, 0) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(kdajit_add_nvrtc_candidate(nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  // A success clears the thread's message.
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(!last_error().empty());
  kdajit_config_t c;
  kdajit_config_init(&c);
  c.arch = "sm_90";
  char name[256];
  REQUIRE(kdajit_config_key(&c, 1, name, sizeof name) == KDAJIT_OK);
  CHECK(last_error().empty());
  CHECK(std::string(kdajit_last_error_detail()).empty());
}

TEST_CASE("c api: out-of-range enum values are rejected by their integer value", "[c_api]") {
  CallConfig cfg;
  const kdajit_decode_args_t good = build_args(cfg, 0x10000000);
  REQUIRE(kdajit_validate_args(KDAJIT_OP_SINGLE, &good) == KDAJIT_OK);

  kdajit_op_t op;
  set_raw(op, 9);
  CHECK(kdajit_validate_args(op, &good) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("op: expected KDAJIT_OP_SINGLE (0) or KDAJIT_OP_PACKED (1), got 9") != std::string::npos);

  kdajit_decode_args_t a = good;
  set_raw(a.state.dtype, 9);
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("state: expected dtype f32 or bf16, got dtype(9)") != std::string::npos);
  a = good;
  set_raw(a.x.dtype, -1);
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("dtype(-1)") != std::string::npos);
  a = good;
  set_raw(a.gate, 7);
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("gate: expected bounded|softplus, got 7") != std::string::npos);
  a = good;
  set_raw(a.state_indices_mode, 1000);
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("got 1000") != std::string::npos);

  kdajit_config_t c;
  kdajit_config_init(&c);
  c.arch = "sm_90";
  set_raw(c.conv_layout, 5);
  CHECK(kdajit_query_support(&c, nullptr, 0) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("conv_layout: expected sd|ds, got 5") != std::string::npos);

  kdajit_runtime_options_t o;
  kdajit_runtime_options_init(&o);
  set_raw(o.log_level, 42);
  kdajit_runtime_t* rt = nullptr;
  CHECK(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(rt == nullptr);
  CHECK(last_error().find("options.log_level") != std::string::npos);
  kdajit_runtime_options_init(&o);
  o.use_tuning = 2;
  CHECK(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("options.use_tuning: expected 0 or 1, got 2") != std::string::npos);
  kdajit_runtime_options_init(&o);
  o.route = "fastest";
  CHECK(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("options.route: kernel key field 'route': expected one of rowcta|") != std::string::npos);
  CHECK(std::string(kdajit_status_string(static_cast<kdajit_status_t>(77))) == "unknown status");
}

TEST_CASE("c api: configuration -> keys, sized buffers, pre-warm without a GPU", "[c_api]") {
  kdajit_config_t c;
  kdajit_config_init(&c);
  c.arch = "sm_90";
  c.heads = 8;
  char name[256];
  REQUIRE(kdajit_config_key(&c, 1, name, sizeof name) == KDAJIT_OK);
  CHECK(std::string(name) == "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_split4.sm_90");
  REQUIRE(kdajit_config_key(&c, 512, name, sizeof name) == KDAJIT_OK);
  CHECK(std::string(name) == "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_rowcta.sm_90");
  c.state_dtype = KDAJIT_DTYPE_BF16;
  char tiny[8];
  CHECK(kdajit_config_key(&c, 1, tiny, sizeof tiny) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("key_name: expected a buffer of at least") != std::string::npos);

  size_t needed = 0;
  REQUIRE(kdajit_config_keys(&c, nullptr, 0, &needed) == KDAJIT_OK);
  std::string buf(needed, '\0');
  REQUIRE(kdajit_config_keys(&c, buf.data(), buf.size(), &needed) == KDAJIT_OK);
  const std::string keys(buf.c_str());
  // Every route of the single op can serve unique slots (a tune table may pick any of them).
  for (const char* route : {"rowcta", "sequential", "split2", "split4"})
    CHECK(keys.find(std::string("route_") + route + ".") != std::string::npos);
  // Repeated slots: only the route that applies rows in order.
  c.state_indices_mode = KDAJIT_INDICES_REPEATED_POSITIVE;
  REQUIRE(kdajit_config_keys(&c, nullptr, 0, &needed) == KDAJIT_OK);
  buf.assign(needed, '\0');
  REQUIRE(kdajit_config_keys(&c, buf.data(), buf.size(), &needed) == KDAJIT_OK);
  CHECK(std::string(buf.c_str()) == "kda_single.h8.state_bf16.conv_sd.t1.gate_bounded.route_sequential.sm_90");
  c.state_dtype = KDAJIT_DTYPE_F32;

  const std::string root = (std::filesystem::temp_directory_path() / ("kdajit-capi-" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  kdajit_runtime_t* rt = quiet_runtime(root);
  int32_t compiled = -1;
  CHECK(kdajit_runtime_prewarm(rt, "kda_single.h8.state_bf16.conv_sd.t1.gate_bounded.route_split4.sm_90", &compiled) ==
        KDAJIT_OK);
  CHECK(compiled == 1);
  CHECK(kdajit_runtime_prewarm(rt, "kda_single.h8.state_bf16.conv_sd.t1.gate_bounded.route_split4.sm_90", &compiled) ==
        KDAJIT_OK);
  CHECK(compiled == 0);
  CHECK(kdajit_runtime_prewarm(rt, "kda_single.h8", &compiled) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().rfind("key_name: kernel key name", 0) == 0);
  kdajit_runtime_destroy(rt);
  std::filesystem::remove_all(root);
}

TEST_CASE("c api: an exception inside the library is a status, never a crash", "[c_api]") {
  kdajit_config_t c;
  kdajit_config_init(&c);
  c.arch = "sm_90";
  size_t needed = 0;
  g_fail_allocations = true;
  const kdajit_status_t s = kdajit_config_keys(&c, nullptr, 0, &needed);  // builds strings: allocates
  g_fail_allocations = false;
  CHECK(s == KDAJIT_ERROR_INTERNAL);
  // The library still works afterwards.
  CHECK(kdajit_config_keys(&c, nullptr, 0, &needed) == KDAJIT_OK);
  CHECK(needed > 1);
}

TEST_CASE("c api: a malformed KDAJIT_ARCH fails runtime creation, naming it", "[c_api]") {
  ::setenv("KDAJIT_ARCH", "sm_89", 1);
  kdajit_runtime_options_t o;
  kdajit_runtime_options_init(&o);
  kdajit_runtime_t* rt = nullptr;
  const kdajit_status_t s = kdajit_runtime_create(&o, &rt);
  ::unsetenv("KDAJIT_ARCH");
  CHECK(s == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(rt == nullptr);
  CHECK(last_error().find("KDAJIT_ARCH: expected one of sm_90|sm_90a|sm_100a|sm_103a|sm_120a, got 'sm_89'") !=
        std::string::npos);
}

// A struct as kdajit.h's *_init sees it: init writes exactly the caller's bytes.
template <class T, class Init>
void check_init_stays_in_bounds(Init init, const char* what) {
  INFO(what);
  unsigned char buf[sizeof(T) + 64];
  for (size_t size : {size_t{0}, size_t{4}, sizeof(size_t), sizeof(T) - 8, sizeof(T), sizeof(T) + 16}) {
    std::memset(buf, 0xA5, sizeof buf);
    init(reinterpret_cast<T*>(buf), size);
    size_t last_written = 0;
    for (size_t i = 0; i < sizeof buf; ++i)
      if (buf[i] != 0xA5) last_written = i + 1;
    CHECK(last_written <= size);
    if (size >= sizeof(size_t)) {
      size_t got = 0;
      std::memcpy(&got, buf, sizeof got);
      CHECK(got == size);
    }
  }
}

TEST_CASE("c api: the *_init functions write struct_size and stay within the caller's size", "[c_api][abi]") {
  check_init_stays_in_bounds<kdajit_runtime_options_t>(kdajit_runtime_options_init_v1, "options");
  check_init_stays_in_bounds<kdajit_decode_args_t>(kdajit_decode_args_init_v1, "args");
  check_init_stays_in_bounds<kdajit_config_t>(kdajit_config_init_v1, "config");
  check_init_stays_in_bounds<kdajit_prefill_args_t>(kdajit_prefill_args_init_v1, "prefill args");
  check_init_stays_in_bounds<kdajit_chunk_args_t>(kdajit_chunk_args_init_v1, "chunk args");
  kdajit_prefill_args_t pa;
  std::memset(&pa, 0x5A, sizeof pa);
  kdajit_prefill_args_init(&pa);
  CHECK(pa.struct_size == sizeof pa);
  CHECK(pa.gate == KDAJIT_GATE_BOUNDED);
  CHECK(pa.lower_bound == -5.0f);
  CHECK(pa.norm_eps == 1e-6f);
  CHECK(pa.max_seq_len == 0);
  CHECK(pa.oob_counter == nullptr);
  CHECK((pa.x.data == nullptr && pa.x.ndim == 0 && pa.has_initial_state.ndim == 0));
  kdajit_config_t c;
  kdajit_config_init(&c);
  CHECK(c.struct_size == sizeof c);
  kdajit_decode_args_t a;
  kdajit_decode_args_init(&a);
  CHECK(a.struct_size == sizeof a);
}

TEST_CASE("c api: a struct_size kdajit does not know is INVALID_ARGUMENT naming the struct", "[c_api][abi]") {
  for (size_t bad : {size_t{0}, sizeof(size_t), sizeof(kdajit_config_t) - 4, sizeof(kdajit_config_t) + 8}) {
    INFO("struct_size " << bad);
    kdajit_config_t c;
    kdajit_config_init(&c);
    c.arch = "sm_90";
    c.struct_size = bad;
    char name[256];
    CHECK(kdajit_config_key(&c, 1, name, sizeof name) == KDAJIT_ERROR_INVALID_ARGUMENT);
    CHECK(last_error().rfind("config.struct_size: expected sizeof(kdajit_config_t) of a kdajit header", 0) == 0);
    CHECK(kdajit_query_support(&c, nullptr, 0) == KDAJIT_ERROR_INVALID_ARGUMENT);
    size_t needed = 0;
    CHECK(kdajit_config_keys(&c, nullptr, 0, &needed) == KDAJIT_ERROR_INVALID_ARGUMENT);
    CHECK(last_error().find("config.struct_size") != std::string::npos);
    if (bad == 0) CHECK(last_error().find("initialise the struct with its *_init function") != std::string::npos);
    if (bad > sizeof c) CHECK(last_error().find("a header newer than this library") != std::string::npos);
  }
  kdajit_decode_args_t a = build_args(CallConfig{}, 0x10000000);
  REQUIRE(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_OK);
  a.struct_size = sizeof a + 8;
  CHECK(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().rfind("args.struct_size: expected sizeof(kdajit_decode_args_t)", 0) == 0);
  CHECK(kdajit_single_decode(reinterpret_cast<kdajit_runtime_t*>(&a), nullptr, nullptr) ==
        KDAJIT_ERROR_INVALID_ARGUMENT);  // NULL args: named before the runtime is used
  kdajit_runtime_options_t o;
  kdajit_runtime_options_init(&o);
  o.struct_size = 0;
  kdajit_runtime_t* rt = nullptr;
  CHECK(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(rt == nullptr);
  CHECK(last_error().rfind("options.struct_size: expected sizeof(kdajit_runtime_options_t)", 0) == 0);
}

// A struct with two header generations: the second appended `extra`.
struct Grown {
  size_t struct_size;
  int32_t first;
  int32_t pad_;
  int64_t extra;
};
Grown grown_defaults() { return {sizeof(Grown), 1, 0, 42}; }

TEST_CASE("c api: a struct from an older header reads its fields and the defaults past its size", "[c_api][abi]") {
  static constexpr size_t sizes[] = {offsetof(Grown, extra), sizeof(Grown)};
  const kdajit::SizedStruct grown{"grown", "Grown", sizes};
  Grown scratch{};
  Grown old{};
  std::memset(&old, 0x7F, sizeof old);  // bytes past the old size are not the caller's: never read
  old.struct_size = offsetof(Grown, extra);
  old.first = 7;
  auto r = kdajit::read_sized(old, scratch, grown_defaults, grown);
  REQUIRE(r);
  CHECK(*r == &scratch);
  CHECK((scratch.struct_size == sizeof(Grown) && scratch.first == 7 && scratch.extra == 42));
  Grown current = grown_defaults();
  current.extra = 5;
  auto same = kdajit::read_sized(current, scratch, grown_defaults, grown);
  REQUIRE(same);
  CHECK(*same == &current);  // the caller's own struct, no copy
  old.struct_size = offsetof(Grown, extra) + 4;
  auto bad = kdajit::read_sized(old, scratch, grown_defaults, grown);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message ==
        "grown.struct_size: expected sizeof(Grown) of a kdajit header that kdajit " KDAJIT_VERSION_STRING
        " knows (16 or 24), got 20");
}

TEST_CASE("c api: kdajit_last_error escapes the control bytes of the caller's input", "[c_api]") {
  kdajit_runtime_options_t o;
  kdajit_runtime_options_init(&o);
  o.arch = "sm_\x1b[31m90\n";
  kdajit_runtime_t* rt = nullptr;
  REQUIRE(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
  const std::string msg = last_error();
  CHECK(msg.find("options.arch: ") == 0);
  CHECK(msg.find("sm_\\x1b[31m90\\n") != std::string::npos);
  CHECK(msg.find('\x1b') == std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
  kdajit_config_t c;
  kdajit_config_init(&c);
  c.arch = "sm_90\x07";
  char reason[256];
  CHECK(kdajit_query_support(&c, reason, sizeof reason) != KDAJIT_OK);
  CHECK(std::string(reason).find("sm_90\\x07") != std::string::npos);
  CHECK(std::string(reason).find('\x07') == std::string::npos);
}

TEST_CASE("c api: options.cache_dir is a cache setting as KDAJIT_CACHE_DIR is", "[c_api]") {
  for (const char* bad : {"L1::L2", ":", "L1:", ":L2"}) {
    INFO(bad);
    kdajit_runtime_options_t o;
    kdajit_runtime_options_init(&o);
    o.cache_dir = bad;
    o.log_level = KDAJIT_LOG_QUIET;
    kdajit_runtime_t* rt = nullptr;
    CHECK(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
    CHECK(rt == nullptr);
    CHECK(last_error().rfind("options.cache_dir: expected a directory or a ':'-separated list of directories", 0) ==
          0);
  }
}

TEST_CASE("c api: kdajit_tables_json is built once and spells the tables", "[c_api]") {
  // tests/python/test_abi.py reads it in full; here: one object, the same pointer every call.
  const char* text = kdajit_tables_json();
  REQUIRE(text != nullptr);
  CHECK(text == kdajit_tables_json());
  const std::string j(text);
  CHECK(j.front() == '{');
  CHECK(j.find("\"version\":\"" KDAJIT_VERSION_STRING "\"") != std::string::npos);
  CHECK(j.find("{\"compute_capability\":90,\"name\":\"sm_90a\"}") != std::string::npos);
  CHECK(j.find("\"9.0\":\"sm_90\"") != std::string::npos);
  CHECK(j.find("{\"name\":\"sequential\",\"ops\":[\"single\"]}") != std::string::npos);
}

TEST_CASE("c api: the prefill entry points: validation, sized args, NULLs", "[c_api][prefill]") {
  kdajit_prefill_args_t a = build_prefill_args(PrefillConfig{}, 0x10000000);
  REQUIRE(kdajit_validate_prefill_args(&a) == KDAJIT_OK);
  CHECK(last_error().empty());
  // A rule broken: INVALID_ARGUMENT naming the argument and the expected value.
  kdajit_prefill_args_t bad = a;
  bad.max_seq_len = -3;
  CHECK(kdajit_validate_prefill_args(&bad) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().rfind("max_seq_len: expected 0 (T_total) or a bound >= 1", 0) == 0);
  bad = a;
  bad.query_start_loc.shape[0] = 3;
  CHECK(kdajit_validate_prefill_args(&bad) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().rfind("query_start_loc: expected shape [N+1=4], got [3]", 0) == 0);
  bad = a;
  bad.A_log.shape[0] = 200;
  CHECK(kdajit_validate_prefill_args(&bad) == KDAJIT_ERROR_UNSUPPORTED);
  // struct_size: one generation so far; any other size is named.
  for (size_t size : {size_t{0}, offsetof(kdajit_prefill_args_t, max_seq_len), sizeof a + 8}) {
    INFO("struct_size " << size);
    bad = a;
    bad.struct_size = size;
    CHECK(kdajit_validate_prefill_args(&bad) == KDAJIT_ERROR_INVALID_ARGUMENT);
    CHECK(last_error().rfind("args.struct_size: expected sizeof(kdajit_prefill_args_t) of a kdajit header", 0) == 0);
  }
  CHECK(kdajit_validate_prefill_args(nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "args: expected a kdajit_prefill_args_t, got NULL");
  CHECK(kdajit_prefill(nullptr, &a, nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("runtime: expected a runtime") != std::string::npos);
  CHECK(kdajit_prefill(reinterpret_cast<kdajit_runtime_t*>(&a), nullptr, nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "args: expected a kdajit_prefill_args_t, got NULL");
}

TEST_CASE("c api: the decode entry points name the prefill op; the config ones serve it", "[c_api][prefill]") {
  const kdajit_decode_args_t d = build_args(CallConfig{}, 0x10000000);
  CHECK(kdajit_validate_args(KDAJIT_OP_PREFILL, &d) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("got KDAJIT_OP_PREFILL (2)") != std::string::npos);
  CHECK(last_error().find("kdajit_prefill_args_t") != std::string::npos);

  const std::string root = (std::filesystem::temp_directory_path() / ("kdajit-capi-pf-" + std::to_string(getpid()))).string();
  kdajit_runtime_t* rt = quiet_runtime(root);
  char name[256];
  CHECK(kdajit_selected_key(rt, KDAJIT_OP_PREFILL, &d, nullptr, name, sizeof name) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("got KDAJIT_OP_PREFILL") != std::string::npos);
  kdajit_runtime_destroy(rt);
  std::filesystem::remove_all(root);

  kdajit_config_t c;
  kdajit_config_init(&c);
  c.op = KDAJIT_OP_PREFILL;
  c.arch = "sm_90";
  c.heads = 16;
  c.tokens = 64;
  char reason[256];
  CHECK(kdajit_query_support(&c, reason, sizeof reason) == KDAJIT_OK);
  CHECK(std::string(reason).empty());
  // N sequences of one chunk each, no workspace: route pipe16 (its keys carry t16).
  REQUIRE(kdajit_config_key(&c, 1, name, sizeof name) == KDAJIT_OK);
  CHECK(std::string(name) == "kda_prefill.h16.state_f32.conv_sd.t16.gate_bounded.route_pipe16.sm_90");
  c.state_dtype = KDAJIT_DTYPE_BF16;
  c.conv_layout = KDAJIT_CONV_DS;
  c.gate = KDAJIT_GATE_SOFTPLUS;
  REQUIRE(kdajit_config_key(&c, 300, name, sizeof name) == KDAJIT_OK);
  CHECK(std::string(name) == "kda_prefill.h16.state_bf16.conv_ds.t16.gate_softplus.route_pipe16.sm_90");
  size_t needed = 0;
  REQUIRE(kdajit_config_keys(&c, nullptr, 0, &needed) == KDAJIT_OK);
  std::string buf(needed, '\0');
  REQUIRE(kdajit_config_keys(&c, buf.data(), buf.size(), &needed) == KDAJIT_OK);
  CHECK(std::string(buf.c_str()) ==
        "kda_prefill.h16.state_bf16.conv_ds.t64.gate_softplus.route_twopass.sm_90\n"
        "kda_prefill.h16.state_bf16.conv_ds.t16.gate_softplus.route_pipe16.sm_90");
  // tokens must be the chunk size; heads past 128 are UNSUPPORTED as for decode.
  c.tokens = 4;
  CHECK(kdajit_query_support(&c, reason, sizeof reason) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(reason) == "tokens: expected 64 (the chunk size of the prefill op's keys), got 4");
  CHECK(kdajit_config_key(&c, 1, name, sizeof name) == KDAJIT_ERROR_INVALID_ARGUMENT);
  c.tokens = 64;
  c.heads = 129;
  CHECK(kdajit_query_support(&c, reason, sizeof reason) == KDAJIT_ERROR_UNSUPPORTED);
  CHECK(std::string(reason).rfind("A_log: expected shape [H]", 0) == 0);
}

TEST_CASE("c api: the chunk entry points: init, validation, sized args, NULLs, the config ones", "[c_api][chunk]") {
  kdajit_chunk_args_t a;
  std::memset(&a, 0xEE, sizeof a);
  kdajit_chunk_args_init(&a);
  CHECK(a.struct_size == sizeof a);
  CHECK(a.gate == KDAJIT_GATE_BOUNDED);
  CHECK(a.lower_bound == -5.f);
  CHECK(a.scale == 0x1.6a09e6p-4f);  // 1 / sqrt(128) as f32
  CHECK((a.qk_l2norm == 1 && a.beta_sigmoid == 1 && a.state_v_first == 0 && a.max_seq_len == 0));
  CHECK((a.q.data == nullptr && a.q.ndim == 0 && a.initial_state.ndim == 0 && a.dt_bias.ndim == 0));
  // An all-empty struct fails on the first tensor the rules read.
  CHECK(kdajit_validate_chunk_args(&a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().rfind("A_log: expected a non-null data pointer", 0) == 0);
  for (size_t size : {size_t{0}, offsetof(kdajit_chunk_args_t, max_seq_len), sizeof a + 8}) {
    INFO("struct_size " << size);
    kdajit_chunk_args_t bad = a;
    bad.struct_size = size;
    CHECK(kdajit_validate_chunk_args(&bad) == KDAJIT_ERROR_INVALID_ARGUMENT);
    CHECK(last_error().rfind("args.struct_size: expected sizeof(kdajit_chunk_args_t) of a kdajit header", 0) == 0);
  }
  CHECK(kdajit_validate_chunk_args(nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "args: expected a kdajit_chunk_args_t, got NULL");
  CHECK(kdajit_chunk(nullptr, &a, nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("runtime: expected a runtime") != std::string::npos);
  CHECK(kdajit_chunk(reinterpret_cast<kdajit_runtime_t*>(&a), nullptr, nullptr) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "args: expected a kdajit_chunk_args_t, got NULL");
  const kdajit_decode_args_t d = build_args(CallConfig{}, 0x10000000);
  CHECK(kdajit_validate_args(KDAJIT_OP_CHUNK, &d) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("kdajit_chunk_args_t") != std::string::npos);

  // The key queries: NULLs, then validation before any device is touched.
  char key[256];
  CHECK(kdajit_selected_chunk_key(nullptr, &a, nullptr, key, sizeof key) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("runtime: expected a runtime") != std::string::npos);
  const std::string qroot = (std::filesystem::temp_directory_path() / ("kdajit-capi-ck-" + std::to_string(getpid()))).string();
  kdajit_runtime_t* rt = quiet_runtime(qroot);
  CHECK(kdajit_selected_chunk_key(rt, nullptr, nullptr, key, sizeof key) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "args: expected a kdajit_chunk_args_t, got NULL");
  CHECK(kdajit_selected_chunk_key(rt, &a, nullptr, key, sizeof key) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().rfind("A_log: expected a non-null data pointer", 0) == 0);
  CHECK(kdajit_selected_prefill_key(rt, nullptr, nullptr, key, sizeof key) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error() == "args: expected a kdajit_prefill_args_t, got NULL");
  kdajit_prefill_args_t pa = build_prefill_args(PrefillConfig{}, 0x10000000);
  pa.max_seq_len = -1;
  CHECK(kdajit_selected_prefill_key(rt, &pa, nullptr, key, sizeof key) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().rfind("max_seq_len: expected 0 (T_total)", 0) == 0);
  kdajit_runtime_destroy(rt);
  std::filesystem::remove_all(qroot);

  kdajit_config_t c;
  kdajit_config_init(&c);
  c.op = KDAJIT_OP_CHUNK;
  c.arch = "sm_90";
  c.heads = 32;
  c.tokens = 64;
  char reason[256], name[256];
  CHECK(kdajit_query_support(&c, reason, sizeof reason) == KDAJIT_OK);
  REQUIRE(kdajit_config_key(&c, 2, name, sizeof name) == KDAJIT_OK);
  CHECK(std::string(name) == "kda_chunk.h32.state_f32.conv_sd.t16.gate_bounded.route_pipe16.sm_90");
  // The chunk op has no conv: a DS configuration names that.
  c.conv_layout = KDAJIT_CONV_DS;
  CHECK(kdajit_query_support(&c, reason, sizeof reason) == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(reason) == "conv_layout: expected sd for the chunk op (it has no conv; its keys carry sd), got ds");
}

TEST_CASE("c api: kdajit_tables_json spells the prefill op and its routes", "[c_api][prefill]") {
  const std::string j(kdajit_tables_json());
  CHECK(j.find("\"op\":{\"chunk\":3,\"packed\":1,\"prefill\":2,\"single\":0}") != std::string::npos);
  CHECK(j.find("{\"name\":\"rowcta\",\"ops\":[\"single\",\"packed\",\"prefill\",\"chunk\"]}") != std::string::npos);
  CHECK(j.find("{\"name\":\"split8\",\"ops\":[\"prefill\",\"chunk\"]}") != std::string::npos);
  CHECK(j.find("{\"name\":\"stream\",\"ops\":[\"single\",\"packed\"]}") != std::string::npos);
  CHECK(j.find("\"prefill_chunk\":64") != std::string::npos);
}

TEST_CASE("c api: libkdajit.so does not link NVRTC (it is dlopen'ed)", "[c_api]") {
  FILE* p = popen("ldd " KDAJIT_LIBRARY_PATH " 2>&1", "r");
  REQUIRE(p != nullptr);
  std::string out;
  char line[512];
  while (fgets(line, sizeof line, p)) out += line;
  REQUIRE(pclose(p) == 0);
  INFO(out);
  CHECK(out.find("libkdajit") == std::string::npos);  // ldd lists dependencies, not the library itself
  CHECK(out.find("libnvrtc") == std::string::npos);
  CHECK(out.find("libcuda") == std::string::npos);
  CHECK(out.find("libc.so") != std::string::npos);  // ldd did read it
}

}  // namespace
