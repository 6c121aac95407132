#include "cuda_on_cpu.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>

namespace kdajit::emu {

Dim3 grid_dim;

namespace {

struct Run {
  ucontext_t scheduler{};
  std::vector<Cta> ctas;
  std::vector<Fiber> fibers;
  const std::function<void()>* entry = nullptr;
  Fiber* cur = nullptr;
  // The cluster barrier: arrivals per phase (two phases can be open at once).
  long long cluster_arrived[2] = {0, 0};
  long long cluster_done = 0;  // phases every fiber has arrived at
  // Arrivals and exits: a scheduler round that adds none is a deadlock.
  long long events = 0;
  // The mbarriers, by address: arrivals still to come, transaction bytes
  // still to count (negative while copies land before their expect_tx), the
  // current phase's parity.
  struct Mbar {
    unsigned arrivals = 0, pending = 0, phase = 0;
    long long tx = 0;
  };
  std::map<const void*, Mbar> mbars;
  // Bulk copies issued and not yet landed: each lands at the start of a later
  // scheduler round, at random (or when every thread waits), so that a read
  // before the wait for its phase sees the buffer's old bytes.
  struct Copy {
    void* dst;
    const void* src;
    unsigned bytes;
    Mbar* bar;
  };
  std::vector<Copy> copies;
};
Run* g_run = nullptr;
int g_slow_first = 1, g_slow_last = 0;

// Fiber stacks, kept from one cluster to the next and never zeroed: a page is
// touched only where a fiber's frames reach.
constexpr size_t kStackBytes = 256 << 10;
std::vector<std::unique_ptr<char[]>>& stack_pool(size_t n) {
  static std::vector<std::unique_ptr<char[]>> pool;
  while (pool.size() < n) pool.emplace_back(new char[kStackBytes]);
  return pool;
}

// A fiber cannot unwind into the scheduler: a fault of the emulated kernel ends the test process.
[[noreturn]] void fatal(const std::string& what) {
  std::fprintf(stderr, "emulation: %s\n", what.c_str());
  std::abort();
}

void fiber_main(unsigned hi, unsigned lo) {
  Fiber* f = reinterpret_cast<Fiber*>((static_cast<uintptr_t>(hi) << 32) | lo);
  (*g_run->entry)();
  if (!f->async_open.empty() || !f->async_groups.empty()) fatal("a thread exited with a cp.async copy in flight");
  f->done = true;
  ++g_run->events;
  swapcontext(&f->ctx, &g_run->scheduler);
}

Warp& my_warp() { return current()->cta->warps[current()->tid.x >> 5]; }

// Every one of `n` threads arrives (count), the last starts the next
// generation (gen); returns once it has.
void arrive_wait(long long& gen, int& count, int n) {
  ++g_run->events;
  const long long mine = gen;
  if (++count == n) {
    count = 0;
    ++gen;
  } else {
    while (gen == mine) yield();
  }
}
void warp_arrive_wait(Warp& w) { arrive_wait(w.gen, w.count, 32); }

float tf32_value(unsigned u) { return __uint_as_float(u & 0xffffe000u); }

std::map<std::string, std::pair<Entry, size_t>>& kernels() {
  static std::map<std::string, std::pair<Entry, size_t>> k;
  return k;
}

}  // namespace

bool register_kernel(const char* key, Entry entry, size_t params_bytes) {
  kernels()[key] = {entry, params_bytes};
  return true;
}

Entry find_kernel(const std::string& key, size_t* params_bytes) {
  const auto it = kernels().find(key);
  if (it == kernels().end()) return nullptr;
  *params_bytes = it->second.second;
  return it->second.first;
}

void unsupported(const char* ptx) { fatal(std::string("a PTX statement the rewrite does not know: `") + ptx + "`"); }

Fiber* current() { return g_run->cur; }

void yield() { swapcontext(&g_run->cur->ctx, &g_run->scheduler); }

unsigned char* dynamic_smem() { return current()->cta->smem.data(); }

// __syncthreads / __syncthreads_and: barrier 0 of every thread of the CTA.
int barrier_and(int pred) { return named_barrier(0, static_cast<int>(g_run->fibers.size() / g_run->ctas.size()), pred); }

int named_barrier(int id, int count, int pred) {
  Cta& c = *current()->cta;
  if (id < 0 || id >= 16 || count <= 0 || count % 32 != 0) fatal("a named barrier with a bad id or thread count");
  NamedBarrier& b = c.named[id];
  ++g_run->events;
  const long long gen = b.gen;
  b.acc &= pred ? 1 : 0;
  if (++b.count == count) {
    b.result = b.acc;
    b.acc = 1;
    b.count = 0;
    ++b.gen;
  } else {
    while (b.gen == gen) yield();
  }
  return b.result;
}

float shfl_xor(float v, int off) {
  Warp& w = my_warp();
  const int lane = static_cast<int>(current()->tid.x & 31), b = static_cast<int>(w.gen & 1);
  w.f[b][lane] = v;
  warp_arrive_wait(w);
  return w.f[b][lane ^ off];
}

void warp_sync() { warp_arrive_wait(my_warp()); }

// Fragments (lane = 4 g + q): A a0 (g, q), a1 (g+8, q), a2 (g, q+4), a3 (g+8, q+4);
// B b0 (k q, n g), b1 (k q+4, n g); C c0 (g, 2q), c1 (g, 2q+1), c2 (g+8, 2q), c3 (g+8, 2q+1).
void mma_m16n8k8_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  Warp& w = my_warp();
  const int lane = static_cast<int>(current()->tid.x & 31), b = static_cast<int>(w.gen & 1);
  unsigned* m = w.u[b][lane];
  m[0] = a0, m[1] = a1, m[2] = a2, m[3] = a3, m[4] = b0, m[5] = b1;
  warp_arrive_wait(w);
  float A[16][8], B[8][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, q = l & 3;
    const unsigned* s = w.u[b][l];
    A[g][q] = tf32_value(s[0]);
    A[g + 8][q] = tf32_value(s[1]);
    A[g][q + 4] = tf32_value(s[2]);
    A[g + 8][q + 4] = tf32_value(s[3]);
    B[q][g] = tf32_value(s[4]);
    B[q + 4][g] = tf32_value(s[5]);
  }
  const int g = lane >> 2, q = lane & 3;
  const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * q, 2 * q + 1, 2 * q, 2 * q + 1};
  for (int e = 0; e < 4; ++e) {
    float s = c[e];
    for (int k = 0; k < 8; ++k) s += A[rows[e]][k] * B[k][cols[e]];
    c[e] = s;
  }
}

unsigned long long shared_window(const void* p) {
  const auto& smem = current()->cta->smem;
  const auto* b = static_cast<const unsigned char*>(p);
  if (b < smem.data() || b >= smem.data() + smem.size()) fatal("a shared-window address of memory outside the CTA's shared memory");
  return static_cast<unsigned long long>(b - smem.data());
}

void wgmma_tf32(float* d, int n, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned long long desc) {
  Cta& cta = *current()->cta;
  const int tid = static_cast<int>(current()->tid.x), t = tid & 127;
  WarpGroup& wg = cta.groups[tid >> 7];
  const int b = static_cast<int>(wg.gen & 1);
  wg.a[b][t][0] = a0, wg.a[b][t][1] = a1, wg.a[b][t][2] = a2, wg.a[b][t][3] = a3;
  arrive_wait(wg.gen, wg.count, 128);
  // A (64 x 8): thread t' = 32 w + 4 g + q holds (16 w + g, q), (+8, q), (16 w + g, q + 4), (+8, q + 4).
  float A[64][8];
  for (int u = 0; u < 128; ++u) {
    const int w = u >> 5, g = (u >> 2) & 7, q = u & 3, r = 16 * w + g;
    const unsigned* s = wg.a[b][u];
    A[r][q] = tf32_value(s[0]);
    A[r + 8][q] = tf32_value(s[1]);
    A[r][q + 4] = tf32_value(s[2]);
    A[r + 8][q + 4] = tf32_value(s[3]);
  }
  // B (8 x n), K-major without swizzle: element (k, col) at start + (col / 8) sbo + (k / 4) lbo + (col % 8) 16 + (k % 4) 4.
  if ((desc >> 62) != 0) fatal("wgmma: a swizzled descriptor (the emulation knows no swizzle only)");
  const size_t start = (desc & 0x3FFFull) << 4, lbo = ((desc >> 16) & 0x3FFFull) << 4, sbo = ((desc >> 32) & 0x3FFFull) << 4;
  auto B = [&](int k, int col) {
    const size_t at = start + (col / 8) * sbo + (k / 4) * lbo + (col % 8) * 16 + (k % 4) * 4;
    if (at + 4 > cta.smem.size()) fatal("wgmma: a B element past the CTA's shared memory");
    unsigned u;
    std::memcpy(&u, cta.smem.data() + at, 4);
    return tf32_value(u);
  };
  const int w = t >> 5, g = (t >> 2) & 7, q = t & 3;
  for (int j = 0; j < n / 8; ++j) {
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + g + 8 * (e >> 1), col = 8 * j + 2 * q + (e & 1);
      float s = d[4 * j + e];
      for (int k = 0; k < 8; ++k) s += A[row][k] * B(k, col);
      d[4 * j + e] = s;
    }
  }
}

unsigned tf32_rn(float x) {  // cvt.rn.tf32.f32: nearest, ties to even
  unsigned u = __float_as_uint(x);
  if ((u & 0x7f800000u) != 0x7f800000u) u += 0xfffu + ((u >> 13) & 1u);
  return u & 0xffffe000u;
}

unsigned short bf16_rn(float x) {  // cvt.rn.bf16.f32: nearest even
  unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}

int cluster_rank() { return current()->cta->rank; }

void cluster_arrive() {
  ++g_run->events;
  ++g_run->cluster_arrived[current()->cluster_phase++ & 1];
}

void cluster_wait() {
  const long long phase = current()->cluster_phase - 1;  // the one this fiber arrived at last
  const long long all = static_cast<long long>(g_run->fibers.size());
  while (g_run->cluster_done <= phase) {
    if (g_run->cluster_arrived[phase & 1] == all) {
      g_run->cluster_arrived[phase & 1] = 0;
      g_run->cluster_done = phase + 1;
      break;
    }
    yield();
  }
}

void* cluster_peer(void* local, int rank) {
  Cta& me = *current()->cta;
  const size_t off = static_cast<size_t>(static_cast<unsigned char*>(local) - me.smem.data());
  if (off >= me.smem.size() || rank < 0 || rank >= static_cast<int>(g_run->ctas.size()))
    fatal("a distributed shared-memory store outside the cluster's shared memory");
  return g_run->ctas[static_cast<size_t>(rank)].smem.data() + off;
}

namespace {
// The mbarrier at `bar`, which must lie in the calling CTA's shared memory.
Run::Mbar& mbar(void* bar, bool create = false) {
  Cta& me = *current()->cta;
  const auto* b = static_cast<unsigned char*>(bar);
  if (b < me.smem.data() || b + 8 > me.smem.data() + me.smem.size() || reinterpret_cast<uintptr_t>(b) % 8 != 0)
    fatal("an mbarrier outside this CTA's shared memory, or not 8-byte aligned");
  const auto it = g_run->mbars.find(bar);
  if (it == g_run->mbars.end() && !create) fatal("an mbarrier used before mbarrier.init");
  return create ? g_run->mbars[bar] : it->second;
}
void mbar_complete_if_done(Run::Mbar& m) {
  if (m.pending == 0 && m.tx == 0) {
    m.phase ^= 1;
    m.pending = m.arrivals;
    ++g_run->events;
  }
}
// Lands the pending copies for which `pick` says so.
template <class Pick>
void land_copies(Run& run, Pick pick) {
  std::vector<Run::Copy> left;
  for (const Run::Copy& c : run.copies) {
    if (!pick()) {
      left.push_back(c);
      continue;
    }
    std::memcpy(c.dst, c.src, c.bytes);
    c.bar->tx -= c.bytes;
    ++run.events;
    mbar_complete_if_done(*c.bar);
  }
  run.copies = std::move(left);
}
// Lands each of a thread's cp.async copies in flight that may land early
// with probability 1/2.
void land_async(Fiber& f, std::mt19937_64& rng) {
  const auto land = [&](std::vector<AsyncCopy>& v) {
    std::vector<AsyncCopy> left;
    for (const AsyncCopy& c : v) {
      if (!c.at_wait && rng() % 2 == 0) std::memcpy(c.dst, c.bytes, c.n);
      else left.push_back(c);
    }
    v = std::move(left);
  };
  land(f.async_open);
  for (auto& g : f.async_groups) land(g);
}
}  // namespace

void mbar_init(void* bar, unsigned arrivals) {
  if (arrivals == 0) fatal("mbarrier.init with no arrivals");
  Run::Mbar& m = mbar(bar, true);
  for (const Run::Copy& c : g_run->copies)
    if (c.bar == &m) fatal("mbarrier.init while a bulk copy on it is in flight");
  m = Run::Mbar{arrivals, arrivals, 0, 0};
}

void mbar_arrive_expect_tx(void* bar, unsigned bytes) {
  Run::Mbar& m = mbar(bar);
  if (m.pending == 0) fatal("an mbarrier arrival past the phase's count");
  m.tx += bytes;
  --m.pending;
  ++g_run->events;
  mbar_complete_if_done(m);
}

void mbar_wait(void* bar, unsigned parity) {
  while (mbar(bar).phase == (parity & 1)) yield();
}

void bulk_copy(void* dst, const void* src, unsigned bytes, void* bar) {
  Cta& me = *current()->cta;
  const auto* d = static_cast<unsigned char*>(dst);
  if (bytes % 16 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
    fatal("a bulk copy whose size or addresses are not multiples of 16");
  if (d < me.smem.data() || d + bytes > me.smem.data() + me.smem.size())
    fatal("a bulk copy outside this CTA's shared memory");
  g_run->copies.push_back({dst, src, bytes, &mbar(bar)});
}

void cp_async(void* dst, const void* src, unsigned bytes) {
  Cta& me = *current()->cta;
  const auto* d = static_cast<unsigned char*>(dst);
  if ((bytes != 4 && bytes != 8 && bytes != 16) || reinterpret_cast<uintptr_t>(dst) % bytes != 0 ||
      reinterpret_cast<uintptr_t>(src) % bytes != 0)
    fatal("a cp.async whose size is not 4, 8 or 16, or whose addresses are not aligned to it");
  if (d < me.smem.data() || d + bytes > me.smem.data() + me.smem.size())
    fatal("a cp.async outside this CTA's shared memory");
  static std::mt19937_64 late(0x6370617379ull);  // which copies land only at their wait
  AsyncCopy c{dst, {}, bytes, late() % 2 == 0};
  if (src != nullptr) std::memcpy(c.bytes, src, bytes);
  current()->async_open.push_back(c);
}

void cp_async_commit() {
  Fiber& f = *current();
  f.async_groups.push_back(std::move(f.async_open));
  f.async_open.clear();
}

void cp_async_wait(int n) {
  Fiber& f = *current();
  while (f.async_groups.size() > static_cast<size_t>(n)) {
    for (const AsyncCopy& c : f.async_groups.front()) std::memcpy(c.dst, c.bytes, c.n);
    f.async_groups.erase(f.async_groups.begin());
  }
}

void set_slow_warps(int first, int last) {
  g_slow_first = first;
  g_slow_last = last;
}

void run_cluster(const std::function<void()>& entry, unsigned x, unsigned y0, unsigned z, int cluster, int threads,
                 size_t smem_bytes, unsigned char poison) {
  // An SM's shared memory is at most 228 KiB; the bound also tells the
  // compiler that the buffer below is of sane size.
  if (smem_bytes > 228 * 1024) fatal("a launch with more dynamic shared memory than an SM has");
  if (cluster < 1 || cluster > 16 || threads < 1 || threads > 1024) fatal("a launch shape the emulation does not take");
  Run run;
  run.entry = &entry;
  run.ctas.resize(static_cast<size_t>(cluster));
  for (int r = 0; r < cluster; ++r) {
    Cta& c = run.ctas[static_cast<size_t>(r)];
    c.block = {x, y0 + static_cast<unsigned>(r), z};
    c.rank = r;
    c.smem.assign(smem_bytes, poison);
  }
  run.fibers.resize(static_cast<size_t>(cluster * threads));
  auto& stacks = stack_pool(run.fibers.size());
  g_run = &run;
  for (size_t i = 0; i < run.fibers.size(); ++i) {
    Fiber& f = run.fibers[i];
    f.tid = {static_cast<unsigned>(i % static_cast<size_t>(threads)), 0, 0};
    f.cta = &run.ctas[i / static_cast<size_t>(threads)];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stacks[i].get();
    f.ctx.uc_stack.ss_size = kStackBytes;
    const auto p = reinterpret_cast<uintptr_t>(&f);
    makecontext(&f.ctx, reinterpret_cast<void (*)()>(fiber_main), 2, static_cast<unsigned>(p >> 32),
                static_cast<unsigned>(p & 0xffffffffu));
  }
  // The order the fibers run in changes every round (a fixed seed per
  // cluster): two threads that touch one address between the same two
  // barriers meet in either order across the rounds, so an unordered pair
  // shows as a wrong result instead of always passing one way. Each round
  // also holds back about one warp in four (all its threads), so that warps
  // drift apart between barriers as they do on a GPU: a warp that writes
  // what another has still to read before their next barrier is then seen.
  std::vector<size_t> order(run.fibers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const size_t warps = (run.fibers.size() + 31) / 32;
  std::vector<char> held(warps, 0);
  std::mt19937_64 shuffle(0x6b6461u ^ (static_cast<uint64_t>(x) << 32) ^ y0 ^ (static_cast<uint64_t>(z) << 20));
  for (bool running = true; running;) {
    running = false;
    bool any_held = false;
    land_copies(run, [&] { return shuffle() % 2 == 0; });
    for (Fiber& f : run.fibers) land_async(f, shuffle);
    const long long events = run.events;
    std::shuffle(order.begin(), order.end(), shuffle);
    for (size_t w = 0; w < warps; ++w) {
      const int in_cta = static_cast<int>(w % ((static_cast<size_t>(threads) + 31) / 32));
      held[w] = in_cta >= g_slow_first && in_cta <= g_slow_last ? shuffle() % 8 != 0 : shuffle() % 4 == 0;
    }
    for (size_t i : order) {
      Fiber& f = run.fibers[i];
      if (f.done) continue;
      running = true;
      if (held[i / 32]) {
        any_held = true;
        continue;
      }
      run.cur = &f;
      swapcontext(&run.scheduler, &f.ctx);
    }
    if (running && run.events == events && !any_held) {
      if (!run.copies.empty()) {  // every thread waits on copies still in flight: they land now
        land_copies(run, [] { return true; });
        continue;
      }
      fatal("every live thread waits and none can go on (a barrier some threads skip)");
    }
  }
  if (!run.copies.empty()) fatal("a bulk copy still in flight when every thread has exited");
  g_run = nullptr;
}

}  // namespace kdajit::emu
