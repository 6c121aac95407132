// Internal to kdajit_reference: walking every element of a strided view.
#pragma once

#include <array>
#include <cstdint>

#include "kdajit/kdajit.h"
#include "kdajit/reference.hpp"

namespace kdajit::ref::detail {

using Index = std::array<int64_t, KDAJIT_MAX_DIMS>;

inline int64_t offset_bytes(const kdajit_tensor_t& t, const Index& idx) {
  int64_t off = 0;
  for (int i = 0; i < t.ndim; ++i) off += idx[static_cast<size_t>(i)] * t.strides[i];
  return off * static_cast<int64_t>(dtype_size(t.dtype));
}

// Calls f(idx, byte offset) for every element, in row-major order of idx.
template <class F>
void for_each_element(const kdajit_tensor_t& t, F&& f) {
  if (t.ndim <= 0) return;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] <= 0) return;
  Index idx{};
  while (true) {
    f(idx, offset_bytes(t, idx));
    int d = t.ndim - 1;
    for (; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < t.shape[d]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace kdajit::ref::detail
