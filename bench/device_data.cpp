#include "device_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "kdajit/kdajit.hpp"

namespace kdajit::bench {

namespace {

constexpr const char* kFillSource = R"CUDA(
// kdajit_bench fill kernels: value[i] = offset + scale * z(seed, i), z ~ N(0, 1) (Box-Muller on a
// splitmix64 hash of the index), so any buffer fills in one pass without a generator state.
typedef unsigned long long u64;
__device__ __forceinline__ u64 mix64(u64 x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
__device__ __forceinline__ float normal01(u64 seed, u64 i) {
  const u64 h = mix64(seed ^ mix64(i));
  const float u1 = ((float)(h >> 40) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  const float u2 = (float)(h & 0xffffffULL) * (1.0f / 16777216.0f);   // [0, 1)
  return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307f * u2);
}
extern "C" __global__ void fill_f32(float* p, long long n, u64 seed, float scale, float offset) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    p[i] = offset + scale * normal01(seed, (u64)i);
}
extern "C" __global__ void fill_bf16(unsigned short* p, long long n, u64 seed, float scale, float offset) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned int b = __float_as_uint(offset + scale * normal01(seed, (u64)i));
    b += 0x7fffu + ((b >> 16) & 1u);  // round to nearest even (the values are finite)
    p[i] = (unsigned short)(b >> 16);
  }
}
)CUDA";

constexpr TensorFill<kdajit_decode_args_t> kTensors[] = {
    {&kdajit_decode_args_t::x, 1.0f, 0.0f},
    {&kdajit_decode_args_t::conv_weight, 0.5f, 0.0f},
    {&kdajit_decode_args_t::conv_state, 1.0f, 0.0f},
    {&kdajit_decode_args_t::raw_gate, 1.0f, 0.0f},
    {&kdajit_decode_args_t::raw_beta, 1.0f, 0.0f},
    {&kdajit_decode_args_t::A_log, 0.5f, 0.0f},
    {&kdajit_decode_args_t::dt_bias, 0.1f, 0.0f},
    {&kdajit_decode_args_t::state_indices, 0.0f, 0.0f},
    {&kdajit_decode_args_t::state, 0.1f, 0.0f},
    {&kdajit_decode_args_t::output_gate, 1.0f, 0.0f},
    {&kdajit_decode_args_t::norm_weight, 0.1f, 1.0f},
    {&kdajit_decode_args_t::output, 0.0f, 0.0f},
    {&kdajit_decode_args_t::query_start_loc, 0.0f, 0.0f},
    {&kdajit_decode_args_t::num_accepted_tokens, 0.0f, 0.0f},
};

}  // namespace

int64_t elements(const kdajit_tensor_t& t) {
  if (t.ndim <= 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;  // the bench's views are dense
}

size_t tensor_bytes(const kdajit_tensor_t& t) {
  return static_cast<size_t>(elements(t)) * (t.dtype == KDAJIT_DTYPE_BF16 ? 2u : 4u);
}

std::string fill_source() { return kFillSource; }

kdajit_tensor_t layout_view(kdajit_dtype_t dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides) {
  return tensor_view(nullptr, dtype, shape, strides);
}

std::vector<int32_t> shuffled_slots(int64_t slots, size_t n, std::mt19937_64& rng) {
  std::vector<int32_t> pool(static_cast<size_t>(slots - 1));
  std::iota(pool.begin(), pool.end(), 1);
  std::shuffle(pool.begin(), pool.end(), rng);
  pool.resize(n);
  return pool;
}

Status TensorBuffers::allocate(kdajit_tensor_t& v) {
  const size_t bytes = tensor_bytes(v);
  if (bytes == 0) return {};
  auto& buf = buffers_.emplace_back(std::make_unique<DeviceBuffer>());
  KDAJIT_TRY(buf->allocate(bytes));
  v.data = buf->get();
  bytes_ += bytes;
  return {};
}

Status FillKernels::load(const std::string& cubin) {
  KDAJIT_TRY(module_.load(cubin));
  KDAJIT_TRY_ASSIGN(f32_, module_.function("fill_f32"));
  KDAJIT_TRY_ASSIGN(bf16_, module_.function("fill_bf16"));
  return {};
}

Status FillKernels::fill(const kdajit_tensor_t& t, uint64_t seed, float scale, float offset, cudaStream_t s) const {
  KDAJIT_TRY_ASSIGN(const DriverApi* f, driver());
  long long n = elements(t);
  if (n == 0) return {};
  if (t.dtype != KDAJIT_DTYPE_F32 && t.dtype != KDAJIT_DTYPE_BF16)
    return Error(ErrorCode::internal, "fill: expected an f32 or bf16 tensor");
  void* data = t.data;
  unsigned long long sd = seed;
  void* args[] = {&data, &n, &sd, &scale, &offset};
  CUlaunchConfig cfg{};
  cfg.gridDimX = static_cast<unsigned>(std::min<long long>((n + 255) / 256, 4096));
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 256;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = reinterpret_cast<CUstream>(s);
  BENCH_CU(*f, f->cuLaunchKernelEx(&cfg, t.dtype == KDAJIT_DTYPE_F32 ? f32_ : bf16_, args, nullptr));
  return {};
}

kdajit_decode_args_t layout_args(const Cell& c) {
  const bool packed = c.op == Op::packed;
  const int64_t T = c.tokens, R = rows_of(c), N = c.count;
  const int64_t S = (packed ? N * T : R) + 4;
  kdajit_decode_args_t a = default_decode_args();
  set_shared_views(a, R, c.heads, S, /*taps=*/T + 2, c.conv, c.state);
  a.state_indices =
      packed ? layout_view(KDAJIT_DTYPE_INT32, {N, T}, {T, 1}) : layout_view(KDAJIT_DTYPE_INT32, {R}, {1});
  if (packed) {
    a.query_start_loc = layout_view(KDAJIT_DTYPE_INT32, {N + 1}, {1});
    a.num_accepted_tokens = layout_view(KDAJIT_DTYPE_INT32, {N}, {1});
  }
  a.state_indices_mode = KDAJIT_INDICES_UNIQUE_OR_NULL;
  return a;
}

kdajit_decode_args_t narrow_args(const Cell& c, const kdajit_decode_args_t& base) {
  kdajit_decode_args_t a = base;
  const int64_t R = rows_of(c);
  for (kdajit_tensor_t* t : {&a.x, &a.raw_gate, &a.raw_beta, &a.output_gate, &a.output}) t->shape[0] = R;
  a.state_indices.shape[0] = c.count;  // single: [R]; packed: [N, T]
  if (c.op == Op::packed) {
    a.query_start_loc.shape[0] = c.count + 1;  // qsl[n] = n * T: the first N sequences cover rows [0, N*T)
    a.num_accepted_tokens.shape[0] = c.count;
  }
  return a;
}

kdajit_decode_args_t stand_in_args(const Cell& shape) {
  kdajit_decode_args_t a = layout_args(shape);
  set_stand_in_pointers<kdajit_decode_args_t>(a, kTensors);
  return a;
}

size_t DeviceData::bytes_needed(const Cell& shape) {
  return tensors_bytes<kdajit_decode_args_t>(layout_args(shape), kTensors);
}

Result<std::unique_ptr<DeviceData>> DeviceData::create(const Cell& shape, const FillKernels& fill, cudaStream_t s,
                                                       uint64_t seed, double timeout_s) {
  std::unique_ptr<DeviceData> d(new DeviceData());
  d->args_ = layout_args(shape);
  kdajit_decode_args_t& a = d->args_;
  KDAJIT_TRY(d->buffers_.allocate_and_fill<kdajit_decode_args_t>(a, kTensors, fill, seed, s));

  // Metadata on the host (small), copied once.
  const bool packed = shape.op == Op::packed;
  const int64_t S = a.state.shape[0], T = shape.tokens, N = shape.count;
  std::mt19937_64 rng(seed);
  // distinct live slots, one per row / checkpoint
  const std::vector<int32_t> pool = shuffled_slots(S, static_cast<size_t>(elements(a.state_indices)), rng);
  std::vector<int32_t> qsl, accepted;
  if (packed) {
    for (int64_t n = 0; n <= N; ++n) qsl.push_back(static_cast<int32_t>(n * T));
    for (int64_t n = 0; n < N; ++n) accepted.push_back(static_cast<int32_t>(1 + rng() % static_cast<uint64_t>(T)));
  }
  BENCH_CUDA(cudaMemcpyAsync(a.state_indices.data, pool.data(), pool.size() * 4, cudaMemcpyHostToDevice, s));
  if (packed) {
    BENCH_CUDA(cudaMemcpyAsync(a.query_start_loc.data, qsl.data(), qsl.size() * 4, cudaMemcpyHostToDevice, s));
    BENCH_CUDA(cudaMemcpyAsync(a.num_accepted_tokens.data, accepted.data(), accepted.size() * 4,
                               cudaMemcpyHostToDevice, s));
  }
  // The host vectors are pageable: the copies are done when the calls return, the fills after the wait.
  KDAJIT_TRY(wait_stream(s, timeout_s, "device data fill"));
  return d;
}

}  // namespace kdajit::bench
