#include "mma_rate.hpp"

#include <fmt/format.h>

namespace kdajit::bench {

namespace {

// Each warp runs MMA_CHAINS independent accumulator chains (enough products in
// flight to cover the mma latency), the operands in registers and different
// per thread; the sum of the accumulators is stored, so no product can be
// dropped. The operands are bf16 values near 1 (0x3f80 = 1.0): the sums stay
// finite for any iteration count the bench uses.
constexpr const char* kMmaBody = R"CUDA(
extern "C" __global__ void __launch_bounds__(MMA_THREADS) mma_bf16_rate(float* out, int iters) {
  const unsigned t = threadIdx.x & 31u;
  const unsigned a0 = 0x3f803f80u ^ t, a1 = 0x3f813f7fu ^ t, a2 = 0x3f7f3f81u ^ t, a3 = 0x3f803f81u ^ t;
  const unsigned b0 = 0x3f803f7fu ^ (t << 1), b1 = 0x3f7f3f80u ^ (t << 1);
  float acc[MMA_CHAINS][4];
#pragma unroll
  for (int c = 0; c < MMA_CHAINS; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < MMA_CHAINS; ++c)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};"
          : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < MMA_CHAINS; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
)CUDA";

}  // namespace

std::string mma_rate_source() {
  return fmt::format("// kdajit_bench tensor-core rate\n#define MMA_THREADS {}\n#define MMA_CHAINS {}\n{}",
                     MmaRate::kThreads, MmaRate::kChains, kMmaBody);
}

bool mma_bf16_supported(const std::string& arch) {
  // "sm_<major><minor>[a]": bf16 mma.sync from sm_80 on.
  if (arch.rfind("sm_", 0) != 0 || arch.size() < 5) return false;
  int cc = 0;
  for (size_t i = 3; i < arch.size() && arch[i] >= '0' && arch[i] <= '9'; ++i) cc = cc * 10 + (arch[i] - '0');
  return cc >= 80;
}

Status MmaRate::load(const std::string& cubin, int sms) {
  KDAJIT_TRY(module_.load(cubin));
  KDAJIT_TRY_ASSIGN(fn_, module_.function("mma_bf16_rate"));
  blocks_ = sms * kBlocksPerSm;
  return {};
}

int64_t MmaRate::flops() const {
  return int64_t{blocks_} * (kThreads / 32) * kChains * int64_t{kIters} * kFlopPerMma;
}

Status MmaRate::launch(void* out, cudaStream_t s) const {
  KDAJIT_TRY_ASSIGN(const DriverApi* f, driver());
  if (!fn_) return Error(ErrorCode::internal, "mma rate kernel: not loaded");
  CUlaunchConfig cfg{};
  cfg.gridDimX = static_cast<unsigned>(blocks_);
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = kThreads;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = reinterpret_cast<CUstream>(s);
  int iters = kIters;
  void* args[] = {&out, &iters};
  BENCH_CU(*f, f->cuLaunchKernelEx(&cfg, fn_, args, nullptr));
  return {};
}

}  // namespace kdajit::bench
