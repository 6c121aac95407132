// Small helpers shared by test_reference.cpp and test_problem.cpp.
#pragma once

#include <cstring>
#include <initializer_list>
#include <vector>

#include "catch.hpp"
#include "kdajit/problem.hpp"
#include "kdajit/reference.hpp"

namespace kdajit::ref::test {

inline Problem make_problem(const ProblemSpec& spec) {
  auto p = Problem::make(spec);
  INFO((p ? std::string() : p.error().message));
  REQUIRE(p.ok());
  return std::move(p).value();
}

inline void run_ref(Problem& p) {
  const Status s = p.run_reference();
  INFO((s ? std::string() : s.error().message));
  REQUIRE(s.ok());
}

inline double get(const Problem& p, Tensor t, std::initializer_list<int64_t> idx) { return load(p.view(t), idx); }
inline void set(Problem& p, Tensor t, std::initializer_list<int64_t> idx, double v) { store(p.view(t), idx, v); }
inline int slot_of(const Problem& p, std::initializer_list<int64_t> idx) {
  return static_cast<int>(get(p, Tensor::state_indices, idx));
}

// Bytes of one slot's elements (state or conv_state) in a buffer laid out like p's view.
inline std::vector<std::byte> slot_bytes(const Problem& p, Tensor t, const std::vector<std::byte>& buf, int64_t slot) {
  const kdajit_tensor_t& v = p.view(t);
  const int64_t es = static_cast<int64_t>(dtype_size(v.dtype));
  int64_t n = 1;
  for (int i = 1; i < v.ndim; ++i) n *= v.shape[i];
  const auto* b = buf.data() + slot * v.strides[0] * es;
  return {b, b + n * es};
}

// Copies one row (leading index) of a row tensor from one problem to another.
inline void copy_row(const Problem& from, int64_t from_row, Problem& to, int64_t to_row, Tensor t) {
  const kdajit_tensor_t& v = from.view(t);
  if (v.ndim == 2) {
    for (int64_t i = 0; i < v.shape[1]; ++i) store_bits16(to.view(t), {to_row, i}, load_bits16(v, {from_row, i}));
  } else {
    for (int64_t i = 0; i < v.shape[1]; ++i)
      for (int64_t j = 0; j < v.shape[2]; ++j) store_bits16(to.view(t), {to_row, i, j}, load_bits16(v, {from_row, i, j}));
  }
}

inline void copy_token_inputs(const Problem& from, int64_t from_row, Problem& to, int64_t to_row) {
  for (Tensor t : {Tensor::x, Tensor::raw_gate, Tensor::raw_beta, Tensor::output_gate}) copy_row(from, from_row, to, to_row, t);
}

}  // namespace kdajit::ref::test
