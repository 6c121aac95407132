// Host bf16 helpers for the f64 reference and the test problems.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace kdajit::ref {

// bf16 bits -> f32 (exact).
constexpr float bf16_bits_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// f32 -> bf16 bits, round to nearest even, as cvt.rn.bf16.f32 does: overflow
// goes to inf, NaN stays NaN (made quiet so that truncation cannot turn it into inf).
constexpr uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline constexpr double kBf16Max = 3.3895313892515355e38;  // 0x7f7f: (2 - 2^-7) * 2^127

// Rounds an f64 value to the nearest bf16 (ties to even) in ONE step.
// Choice: the reference is the exact math with the spec's rounding points, so
// it rounds the exact value once. Going through f32 first would add a second
// rounding that the exact math does not have, and it would not track the GPU any
// better: the GPU's f32 value already differs from the exact one by more than an
// f32 ulp. For values exactly representable in f32 both agree bit for bit
// (test_reference checks this), including subnormals, ties and overflow to inf.
//
// In bf16's normal range, [2^-126, 2^128) in magnitude, the rounding is done on
// the f64 bits: keep 7 of the 52 stored fraction bits, ties to even (a carry
// into the exponent is the next binade, as it should be). That is the hot path
// of the test problems and the reference (hundreds of millions of calls per
// GPU test run); test_reference checks it against the frexp / nearbyint form
// below, which every other value takes, on values of every exponent.
inline double round_bf16(double x) {
  const uint64_t u = std::bit_cast<uint64_t>(x);
  const uint64_t mag = u & 0x7fffffffffffffffull;
  if (mag >= 0x3810000000000000ull && mag < 0x47f0000000000000ull) {  // 2^-126 <= |x| < 2^128
    constexpr uint64_t kDropped = (uint64_t{1} << 45) - 1;  // the 45 fraction bits bf16 does not keep
    const double r = std::bit_cast<double>((u + (kDropped >> 1) + ((u >> 45) & 1u)) & ~kDropped);
    return std::fabs(r) > kBf16Max ? std::copysign(std::numeric_limits<double>::infinity(), x) : r;
  }
  if (std::isnan(x) || std::isinf(x) || x == 0.0) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| = m * 2^e with m in [0.5, 1)
  // 8 significant bits; below 2^-126 the spacing stays 2^-133 (bf16 subnormals).
  const int ulp_exp = e - 8 > -133 ? e - 8 : -133;
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -ulp_exp)), ulp_exp);  // default mode: ties to even
  if (std::fabs(r) > kBf16Max) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

// f64 -> bf16 bits through round_bf16 (the f32 step is then exact).
inline uint16_t f64_to_bf16_bits(double x) { return f32_to_bf16_bits(static_cast<float>(round_bf16(x))); }

inline double bf16_bits_to_f64(uint16_t b) { return static_cast<double>(bf16_bits_to_f32(b)); }

}  // namespace kdajit::ref
