#include "prefill_grid.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <tuple>

namespace kdajit::bench {

// ---- CPython's random module, as far as randint needs it ------------------------

PythonRandom::PythonRandom(uint32_t seed) {
  // init_genrand(19650218), then init_by_array(key = [seed]): CPython's
  // random_seed turns a non-negative int into its 32-bit words (0 -> [0]).
  mt_[0] = 19650218u;
  for (uint32_t i = 1; i < 624; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + i;
  const uint32_t key[1] = {seed};
  constexpr uint32_t key_length = 1;
  uint32_t i = 1, j = 0;
  for (uint32_t k = 624; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + j;
    ++i;
    ++j;
    if (i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
    if (j >= key_length) j = 0;
  }
  for (uint32_t k = 623; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - i;
    ++i;
    if (i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
  }
  mt_[0] = 0x80000000u;
  index_ = 624;
}

uint32_t PythonRandom::next_u32() {
  constexpr uint32_t kUpper = 0x80000000u, kLower = 0x7fffffffu, kMatrix = 0x9908b0dfu;
  if (index_ >= 624) {
    for (int k = 0; k < 624; ++k) {
      const uint32_t y = (mt_[k] & kUpper) | (mt_[(k + 1) % 624] & kLower);
      mt_[k] = mt_[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? kMatrix : 0u);
    }
    index_ = 0;
  }
  uint32_t y = mt_[index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint32_t PythonRandom::getrandbits(int k) { return next_u32() >> (32 - k); }

int64_t PythonRandom::randint(int64_t a, int64_t b) {
  // randrange(a, b + 1) = a + _randbelow(n): getrandbits(n.bit_length()) until below n.
  const uint64_t n = static_cast<uint64_t>(b - a) + 1;
  int k = 0;
  while (k < 64 && (n >> k) != 0) ++k;
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return a + static_cast<int64_t>(r);
}

std::vector<int32_t> mix_lengths(int n) {
  PythonRandom rng(0);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(std::max(n, 0)));
  for (int i = 0; i < n; ++i) out.push_back(static_cast<int32_t>(rng.randint(100, 2000)));
  return out;
}

// ---- Cells ------------------------------------------------------------------------

namespace {

// A decimal integer in lo..hi that is the whole of `s`, or -1.
int64_t whole_number(const std::string& s, int64_t lo, int64_t hi) {
  if (s.empty() || s.size() > 18 || !std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    return -1;
  const int64_t v = std::strtoll(s.c_str(), nullptr, 10);
  return v >= lo && v <= hi ? v : -1;
}

}  // namespace

int64_t PrefillCell::tokens() const { return std::accumulate(lengths.begin(), lengths.end(), int64_t{0}); }

int64_t PrefillCell::longest() const {
  return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
}

Result<std::vector<int32_t>> prompt_lengths(const std::string& shape) {
  auto bad = [&] {
    return invalid_argument(fmt::format(
        "--shapes: expected NxL (N prompts of L tokens) or mixN (N prompts of 100-2000 tokens), N in 1..{}, at most "
        "{} tokens in all, got '{}'",
        kPrefillMaxPrompts, kPrefillMaxTokens, shape));
  };
  std::vector<int32_t> out;
  if (shape.rfind("mix", 0) == 0) {
    const int64_t n = whole_number(shape.substr(3), 1, kPrefillMaxPrompts);
    if (n < 0) return bad();
    out = mix_lengths(static_cast<int>(n));
  } else {
    const size_t x = shape.find('x');
    if (x == std::string::npos) return bad();
    const int64_t n = whole_number(shape.substr(0, x), 1, kPrefillMaxPrompts);
    const int64_t l = whole_number(shape.substr(x + 1), 1, kPrefillMaxTokens);
    if (n < 0 || l < 0 || n * l > kPrefillMaxTokens) return bad();
    out.assign(static_cast<size_t>(n), static_cast<int32_t>(l));
  }
  if (std::accumulate(out.begin(), out.end(), int64_t{0}) > kPrefillMaxTokens) return bad();
  return out;
}

std::string prefill_cell_name(const PrefillCell& c) {
  return fmt::format("prefill {} h{} {} {}", c.shape, c.heads, to_string(c.state), to_string(c.conv));
}

int64_t prefill_bytes(const PrefillCell& c) {
  const int64_t per_seq_head = 2 * D * D * state_elem_bytes(c.state) + kPrefillConvBytesPerSeqHead;
  return c.heads * (c.seqs() * per_seq_head + c.tokens() * kPrefillBytesPerTokenHead);
}

int64_t prefill_flops(const PrefillCell& c) {
  int64_t chunks = 0;
  for (int32_t l : c.lengths) chunks += (l + kChunkTokens - 1) / kChunkTokens;
  return chunks * c.heads * kFlopPerChunkHead;
}

PrefillFloors prefill_floors(const PrefillCell& c, double copy_gbps, double mma_flops) {
  PrefillFloors f;
  f.memory_us = copy_gbps > 0 ? static_cast<double>(prefill_bytes(c)) / (copy_gbps * 1e9) * 1e6 : 0;
  if (mma_flops > 0) f.tensor_core_us = static_cast<double>(prefill_flops(c)) / mma_flops * 1e6;
  const bool memory = f.memory_us >= f.tensor_core_us;
  f.floor_us = memory ? f.memory_us : f.tensor_core_us;
  f.binds = memory ? "memory" : "tensor core";
  return f;
}

Result<std::vector<PrefillCell>> make_prefill_cells(const Options& o) {
  if (!o.rows.empty())
    return invalid_argument("--rows: applies to the decode ops; the prefill grid takes its prompts from --shapes");
  if (!o.tokens.empty())
    return invalid_argument("--tokens: applies to the packed op; the prefill grid takes its prompts from --shapes");
  KDAJIT_TRY_ASSIGN(SharedAxes axes, parse_shared_axes(o));
  const std::vector<StateDtype>& states = axes.states;
  if (axes.convs.empty()) axes.convs.push_back(ConvLayout::sd);
  const std::vector<ConvLayout>& convs = axes.convs;
  const std::vector<int>& heads = o.heads.empty() ? kPrefillDefaultHeads : o.heads;
  const std::vector<std::string>& shapes = o.shapes.empty() ? kPrefillDefaultShapes : o.shapes;

  std::vector<PrefillCell> out;
  for (const std::string& shape : shapes) {
    KDAJIT_TRY_ASSIGN(std::vector<int32_t> lengths, prompt_lengths(shape));
    for (int h : heads)
      for (StateDtype st : states)
        for (ConvLayout cv : convs) {
          PrefillCell c{shape, lengths, h, st, cv};
          auto same = [&](const PrefillCell& u) {
            return std::tie(u.shape, u.heads, u.state, u.conv) == std::tie(c.shape, c.heads, c.state, c.conv);
          };
          if (std::none_of(out.begin(), out.end(), same)) out.push_back(std::move(c));
        }
  }
  return out;
}

double estimate_prefill_call_seconds(const PrefillCell& c) {
  // H200 guesses, from the kernel's times (8x2048 H16 about 1.6 ms, 1x16384 H16
  // about 11 ms): about 50 us per chunk on each (sequence, head) CTA, 132 CTAs
  // at a time; a call takes at least its longest sequence's chunks one after
  // another, and at least its memory traffic at 4 TB/s.
  constexpr double kChunkSeconds = 50e-6, kSms = 132, kBandwidth = 4.0e12;
  int64_t chunks = 0, longest = 0;
  for (int32_t l : c.lengths) {
    const int64_t n = (l + kChunkTokens - 1) / kChunkTokens;
    chunks += n;
    longest = std::max(longest, n);
  }
  const double items = static_cast<double>(chunks) * c.heads;
  const double work = std::max(items / kSms, static_cast<double>(longest)) * kChunkSeconds;
  return std::max(work, static_cast<double>(prefill_bytes(c)) / kBandwidth) + 10e-6;
}

double estimate_prefill_seconds(const Options& o, const std::vector<PrefillCell>& cells, int routes_timed) {
  const double flush_s = static_cast<double>(o.flush_mib) * 1048576.0 / 3.0e12;
  double s = 0;
  for (const PrefillCell& c : cells) {
    const double k = estimate_prefill_call_seconds(c);
    const int replays = o.iters * (1 + routes_timed) + (o.warm ? o.iters : 0);
    const int untimed = 4 * (1 + routes_timed);  // first call, warm-ups, graph upload
    s += replays * (k + flush_s) + untimed * k;
  }
  return s;
}

}  // namespace kdajit::bench
