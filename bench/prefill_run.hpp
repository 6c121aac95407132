// kdajit_bench --op prefill: kdajit's prefill op on the prefill grid
// (prefill_grid.hpp) against its memory floor and its tensor-core floor.
//
// The run: open the device; compile the fill and tensor-core rate kernels with
// NVRTC while every prefill key the grid needs (the selector's and each forced
// route's) is compiled into the kernel cache; the copy roofline and the dense
// bf16 mma.sync rate; then per cell device buffers filled with fresh random data
// and kdajit's call timed as the decode grid's (graph replays, cold L2, the
// median), the selector's route and each forced one. Tables on stdout at the
// end, JSON after each cell.
#pragma once

#include "bench_cuda.hpp"
#include "grid.hpp"

namespace kdajit::bench {

// Everything after option parsing (finish_options): the cells, --routes, --list
// or the run; returns the exit code (setup.hpp).
int prefill_main(const Options& o, Clock::time_point t_start);

}  // namespace kdajit::bench
