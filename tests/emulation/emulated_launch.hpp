// One call of an emulated kernel (cuda_on_cpu.hpp) as the runtime would
// launch it: the key's launch plan for the validated call, every cluster of
// the grid in turn, each CTA's shared memory NaN bytes at the start. With
// `max_wave`, the grid's y has at most that many clusters per head, so that a
// CTA walks several sequences (n, n + wave, ..), as it does when N passes
// 65535 / P (and route twopass's intra-chunk and norm grids at most that many
// units or row groups, so that a CTA walks several). `sm_count` is the
// device's for the launch plan (route twopass's state pass CTAs per sequence
// and head follow from it). A prefill or chunk program (H, the state dtype
// and the conv layout read at run time) runs a call of any of them.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_on_cpu.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/runtime/call/validate.hpp"

namespace kdajit::emu {

// Warps first..last of every CTA run far behind the others from the next
// launch on (cuda_on_cpu.hpp); (1, 0): none.
void set_slow_warps(int first, int last);

// Route twopass's workspace in host memory: twopass_workspace_bytes() for the
// call's sizes, 256-byte aligned, every byte 0xFF (NaN floats, units that
// hold no chunk) until a call writes it; reused, it holds the last call's units.
class Workspace {
 public:
  Workspace(int64_t num_seqs, int64_t rows, int64_t heads)
      : size_(twopass_workspace_bytes(num_seqs, rows, heads)),
        bytes_(static_cast<size_t>(size_ + kWorkspaceAlignment), 0xFF) {}
  void* data() {
    const auto a = reinterpret_cast<uintptr_t>(bytes_.data());
    return bytes_.data() + (kWorkspaceAlignment - a % kWorkspaceAlignment) % kWorkspaceAlignment;
  }
  int64_t size() const { return size_; }

 private:
  int64_t size_;
  std::vector<unsigned char> bytes_;
};

inline void emulate_call(const std::string& key_name, const ValidatedCall& call, unsigned max_wave = 0,
                         int sm_count = 132) {
  auto key = parse_key(key_name);
  if (!key) throw std::runtime_error(key.error().message);
  // A program that reads H from the grid serves every head count: the call's H.
  if (!heads_in_program(key->op, key->route)) key->heads = call.shape.family.heads;
  if (!(key_for(call.shape, key->route, key->arch) == *key))
    throw std::runtime_error(key_name + " is not the call's family on that route");
  // The key's program: one serves every key that differs only in the fields
  // it reads at run time (the kernels register under the program's name).
  size_t params_bytes = 0;
  const std::string program = program_name(*key);
  const Entry entry = find_kernel(program, &params_bytes);
  if (entry == nullptr)
    throw std::runtime_error(key_name + ": its program " + program +
                             " is not emulated (tests/emulation/CMakeLists.txt lists one key of each program)");
  if (params_bytes != sizeof(KdaParams)) throw std::runtime_error(key_name + ": its KdaParams differs from the runtime's");
  LaunchPlan plan = launch_plan(*key, call.shape, DeviceTraits{key->arch, sm_count});
  if (max_wave > 0 && plan.grid.y > max_wave * plan.cluster_y) plan.grid.y = max_wave * plan.cluster_y;
  const KdaParams params = call.params;
  // Route twopass's kernels before and after the key's own: one CTA per grid
  // cell, no cluster, the grid's y clamped like the main grid's.
  auto run_extra = [&](const char* suffix, const char* what, LaunchGrid g, size_t smem_bytes) {
    const Entry extra = find_kernel(program + suffix, &params_bytes);
    if (extra == nullptr) throw std::runtime_error(key_name + ": its program has no emulated " + what);
    if (max_wave > 0 && g.y > max_wave) g.y = max_wave;
    const std::function<void()> run_it = [&] { extra(&params); };
    grid_dim = {g.x, g.y, g.z};
    for (unsigned x = 0; x < g.x; ++x)
      for (unsigned y = 0; y < g.y; ++y) run_cluster(run_it, x, y, 0, 1, static_cast<int>(plan.threads), smem_bytes, 0xFF);
  };
  if (plan.has_pre()) run_extra("#pre", "intra-chunk kernel", plan.pre_grid, plan.pre_dynamic_smem_bytes);
  const std::function<void()> run = [&] { entry(&params); };
  grid_dim = {plan.grid.x, plan.grid.y, plan.grid.z};
  for (unsigned x = 0; x < plan.grid.x; ++x)
    for (unsigned y = 0; y < plan.grid.y; y += plan.cluster_y)
      for (unsigned z = 0; z < plan.grid.z; ++z)
        run_cluster(run, x, y, z, static_cast<int>(plan.cluster_y), static_cast<int>(plan.threads),
                    plan.dynamic_smem_bytes, 0xFF);
  // The prefill op's norm kernel: no dynamic shared memory.
  if (plan.has_post()) run_extra("#post", "norm kernel", plan.post_grid, 0);
}

}  // namespace kdajit::emu
