// The random source of the reference's test problems: mt19937_64 (fully
// specified by the standard) behind draws written out here, so that a seed
// gives the same problem with any C++ library (the standard leaves the
// algorithms of std::normal_distribution and friends to each library: a
// failure on one machine must replay on another).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace kdajit::ref {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class Rng {
 public:
  // Stream `stream` of `seed`: independent streams per tensor, so that a
  // tensor's values depend only on the seed and its logical index.
  Rng(uint64_t seed, uint64_t stream) : gen_(splitmix64(seed ^ splitmix64(stream + 1))) {}
  double uniform() { return static_cast<double>((gen_() >> 11) + 1) * 0x1.0p-53; }  // (0, 1]
  // Marsaglia's polar method (no trigonometry: the state of a large problem has ~1e8 draws).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }
  // Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * (uniform() - 0x1.0p-53); }
  int64_t below(int64_t n) { return static_cast<int64_t>(gen_() % static_cast<uint64_t>(n)); }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(below(static_cast<int64_t>(i)))]);
  }

 private:
  std::mt19937_64 gen_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace kdajit::ref
