// The prefill grid of kdajit_bench (--op prefill): one cell = one prefill call
// (a batch of prompts, H, state dtype, conv layout), with the bytes and the
// matrix FLOPs that give its two floors. The formulas are bench/bench_prefill.py's
// (memory_floor_bytes, chunk_flops), the bytes docs/CONTRACT.md §10.5's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "grid.hpp"
#include "kdajit/error.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit::bench {

// The default prompt batches, bench/bench_prefill.py's --shapes default.
inline const std::vector<std::string> kPrefillDefaultShapes = {"8x2048", "4x8192", "1x16384", "mix64"};
inline const std::vector<int> kPrefillDefaultHeads = {16, 32, 64};
// Timed graph replays per number when --iters is not given: a prefill call takes
// milliseconds, so the decode grid's 200 would take minutes.
inline constexpr int kPrefillDefaultIters = 20;
// A cell's prompts: at most this many, and this many tokens in all.
inline constexpr int64_t kPrefillMaxPrompts = 65536;
inline constexpr int64_t kPrefillMaxTokens = int64_t{1} << 24;

// The chunked algorithm's matrix FLOPs per chunk of C = 64 tokens and head
// (D = 128): Q K^T 2CCD + K K^T 2CCD + the triangular solve applied to K and V
// 2CC(2D) + W S^T 2CDD + Q S^T 2CDD + A Delta 2CCD + Delta^T K 2CDD = 11 * 2^20
// (bench/bench_prefill.py, FLOP_PER_CHUNK_HEAD).
// C: kdajit::kPrefillChunk, the t field of every prefill key.
inline constexpr int64_t kChunkTokens = kPrefillChunk;
inline constexpr int64_t kFlopPerChunkHead = 2 * kChunkTokens * kChunkTokens * D * 2 +     // Q K^T, K K^T
                                             2 * kChunkTokens * kChunkTokens * 2 * D +     // the solve on K and V
                                             2 * kChunkTokens * D * D * 2 +                // W S^T, Q S^T
                                             2 * kChunkTokens * kChunkTokens * D +         // A Delta
                                             2 * kChunkTokens * D * D;                     // Delta^T K
static_assert(kFlopPerChunkHead == 11 * (int64_t{1} << 20));
// Bytes per token and head (x 768, raw_gate 256, raw_beta 2, output_gate 256,
// output 256) and per sequence and head besides the state (3 conv taps of 384
// channels, read and written): docs/CONTRACT.md §10.5.
inline constexpr int64_t kPrefillBytesPerTokenHead = 1538;
inline constexpr int64_t kPrefillConvBytesPerSeqHead = 2 * 3 * 3 * D * 2;

struct PrefillCell {
  std::string shape;             // as given: "8x2048" (N prompts of L tokens) or "mix64"
  std::vector<int32_t> lengths;  // tokens of each prompt, in row order
  int heads = 0;
  StateDtype state = StateDtype::f32;
  ConvLayout conv = ConvLayout::sd;

  int64_t seqs() const { return static_cast<int64_t>(lengths.size()); }
  int64_t tokens() const;   // T_total
  int64_t longest() const;  // max_seq_len
};

// The prompt lengths of a shape: "NxL" (N prompts of L tokens) or "mixN" (N
// prompts of 100..2000 tokens, drawn as bench/bench_prefill.py draws them).
Result<std::vector<int32_t>> prompt_lengths(const std::string& shape);

// The lengths of "mixN": Python's random.Random(0), then N calls of
// randint(100, 2000) (bench/peers/bench_fla_chunk_kda.py, lengths_of), reproduced
// draw for draw: CPython's MT19937 seeded by init_by_array([0]), and randint's
// rejection sampling of 11-bit getrandbits.
std::vector<int32_t> mix_lengths(int n);

// CPython's random.Random(seed) for a seed in 0..2^32-1: the 32-bit outputs and getrandbits(k <= 32).
class PythonRandom {
 public:
  explicit PythonRandom(uint32_t seed);
  uint32_t next_u32();
  uint32_t getrandbits(int k);            // 1 <= k <= 32
  int64_t randint(int64_t a, int64_t b);  // a <= b, b - a < 2^32

 private:
  uint32_t mt_[624];
  int index_ = 624;
};

std::string prefill_cell_name(const PrefillCell& c);

// The op's minimum HBM bytes (§10.5, every sequence live and starting from its
// slot): H * (N * (2 * D * D * b + 4608) + T_total * 1538).
int64_t prefill_bytes(const PrefillCell& c);
// The chunked algorithm's matrix FLOPs: kFlopPerChunkHead per chunk of 64
// tokens (a partial chunk counts whole) and head.
int64_t prefill_flops(const PrefillCell& c);

// A cell's floors, as bench/bench_prefill.py's floors(): the memory floor
// (prefill_bytes over the copy bandwidth) and the tensor-core floor
// (prefill_flops over the dense bf16 rate); the cell's floor is the larger, and
// `binds` says which ("memory" or "tensor core", bench_prefill.py's words).
// mma_flops 0 (not measured): tensor_core_us < 0 (n/a) and the memory floor alone.
struct PrefillFloors {
  double memory_us = 0, tensor_core_us = -1, floor_us = 0;
  std::string binds;
};
PrefillFloors prefill_floors(const PrefillCell& c, double copy_gbps, double mma_flops);

// The grid --shapes x --heads x --state x --conv selects (defaults above; conv sd),
// shapes outermost as in bench_prefill.py; duplicates removed. Rejects the
// decode grid's options (--rows, --tokens).
Result<std::vector<PrefillCell>> make_prefill_cells(const Options& o);

// A rough time of one call on an H200 (about 50 us per chunk of 64 tokens per
// (sequence, head) CTA, 132 SMs): a guide for --list, not a measurement.
double estimate_prefill_call_seconds(const PrefillCell& c);
// Rough seconds of GPU work for the whole run: each cell's timed replays, the
// forced routes included (`routes_timed`), plus its warm-up calls.
double estimate_prefill_seconds(const Options& o, const std::vector<PrefillCell>& cells, int routes_timed);

}  // namespace kdajit::bench
