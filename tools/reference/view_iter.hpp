// Internal to kdajit_reference: walking every element of a strided view.
#pragma once

#include <array>
#include <cstdint>

#include "kdajit/kdajit.h"
#include "kdajit/reference.hpp"

namespace kdajit::ref::detail {

using Index = std::array<int64_t, KDAJIT_MAX_DIMS>;

// Calls f(idx, byte offset) for every element, in row-major order of idx. The
// offset is carried from element to element (the innermost dimension in a
// loop of its own): the test problems walk ~1e8 state elements this way.
template <class F>
void for_each_element(const kdajit_tensor_t& t, F&& f) {
  if (t.ndim <= 0) return;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] <= 0) return;
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
  const int last = t.ndim - 1;
  const int64_t inner = t.shape[last], inner_step = t.strides[last] * es;
  Index idx{};
  int64_t off = 0;  // of idx with idx[last] = 0
  while (true) {
    for (int64_t i = 0; i < inner; ++i) {
      idx[static_cast<size_t>(last)] = i;
      f(static_cast<const Index&>(idx), off + i * inner_step);
    }
    idx[static_cast<size_t>(last)] = 0;
    int d = last - 1;
    for (; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < t.shape[d]) {
        off += t.strides[d] * es;
        break;
      }
      idx[static_cast<size_t>(d)] = 0;
      off -= (t.shape[d] - 1) * t.strides[d] * es;
    }
    if (d < 0) return;
  }
}

}  // namespace kdajit::ref::detail
