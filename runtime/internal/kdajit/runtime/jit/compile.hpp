// The build step's compile: generated source -> cubin for the key's exact arch,
// through the dlopen'ed NVRTC (nvrtc_api.hpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit {

// Everything that determines the compiled binary. The cache hashes all of it.
struct BuildInputs {
  KernelKey key;
  std::string source;                // generate_source(key)
  std::vector<std::string> options;  // canonical NVRTC options
  std::string nvrtc_version;         // e.g. "13.0": of the NVRTC that will compile
};

// Resource usage of the compiled kernel, read from ptxas' verbose log.
// Of a program: its kernels' largest register count, stack frame and static
// shared memory, and every kernel's spills together.
struct KernelResources {
  int registers = -1;
  int spill_bytes = 0;  // spill stores + spill loads
  int stack_bytes = 0;  // stack frame
  int smem_bytes = 0;   // static shared memory
};

// Where a compile's time went, as NVRTC's own `--time` table reports it: the
// C++ front end, the NVVM optimizer (with PTX generation) and the PTX
// translation (ptxas, PTX -> SASS). -1 where NVRTC gave no figure.
struct CompilePhases {
  double frontend_ms = -1;
  double nvvm_ms = -1;
  double ptxas_ms = -1;
  double cpu_ms = -1;          // CPU time of the compiling thread (all phases)
  size_t source_bytes = 0;     // the program NVRTC parses: templates inlined, one system header (<stdint.h>)
};

struct CompiledKernel {
  std::string cubin;
  std::string log;  // NVRTC log (includes ptxas info)
  KernelResources resources;
  double compile_ms = 0;
  CompilePhases phases;
};

std::vector<std::string> canonical_options(const KernelKey& key);

// The canonical options that change only what the front end parses, never the
// generated code: test_sass_identity compiles keys with and without them and
// compares the cubins' code sections.
std::vector<std::string> frontend_only_options();

// Generates the source and collects the options and the NVRTC version (loads
// NVRTC: fails with its error when there is none).
Result<BuildInputs> make_build_inputs(const KernelKey& key);

// Compiles. A failure is an Error{compile_failed} whose message names the key
// and whose detail carries the options, the NVRTC log and the failing source line.
Result<CompiledKernel> compile(const BuildInputs& inputs);

// One NVRTC program: `source` (called `program_name` in NVRTC's log) compiled
// with `options` to a cubin. compile() is this with the key's inputs; tools with
// kernels of their own (kdajit_bench's floor and fill kernels) call it directly.
// Every error message starts with `what`; a failed compile is an
// Error{compile_failed} whose detail carries the options, the NVRTC log and the
// failing source line. `resources` are those of the log's first kernel.
Result<CompiledKernel> compile_program(std::string_view what, const std::string& program_name,
                                       const std::string& source, const std::vector<std::string>& options);

// {"frontend_ms", "nvvm_ms", "ptxas_ms", "cpu_ms", "source_bytes"}; a figure
// NVRTC did not give is left out. `kdajit compile --json`, `prewarm --json` and
// the cache entry's meta carry it.
nlohmann::json phases_to_json(const CompilePhases& phases);

// Reads NVRTC's `--time` CSV rows ("kernel.cu, CUDA C++ Frontend, 180, ms")
// into `phases` (exposed for tests).
void parse_phase_times(const std::string& csv, CompilePhases& phases);

// Parses "ptxas info" lines of a verbose log (exposed for tests).
KernelResources parse_ptxas_log(const std::string& log);

// The compute capabilities the loaded NVRTC can target (e.g. 90, 100, 120);
// empty when there is no NVRTC.
const std::vector<int>& nvrtc_compute_capabilities();

// Whether this build can compile for `arch`: NVRTC lists its compute
// capability. Error{unsupported} naming the arch and NVRTC's list otherwise.
Status check_arch_target(Arch arch);

}  // namespace kdajit
