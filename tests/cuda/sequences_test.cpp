// Ragged (packed) batches and paged K/V caches on the CUDA backend: the CPU tests' random batches
// (tests/sequences_batch.hpp) with every buffer mirrored on the device, each sequence checked against the float64
// reference of itself alone, on the plan's kernel and on every other kernel that accepts the problem. Then what
// only the device has: out-of-range device arrays (the documented result, docs/numerics.md), and a capture in a
// CUDA graph in the strict mode replayed with new lengths and block tables.
#include "../sequences_batch.hpp"

#include "forced_plan.hpp"
#include "gpu_test_support.hpp"

#include <cuda_runtime.h>

namespace attnkit {
namespace {

using testing::check;
using testing::cuda_config;

// Device copies of a batch's buffers, by host address, freed with the object.
class DeviceCopies {
 public:
  DeviceCopies() = default;
  DeviceCopies(const DeviceCopies&) = delete;
  DeviceCopies& operator=(const DeviceCopies&) = delete;
  ~DeviceCopies() {
    for (const Copy& c : copies_) cudaFree(c.device);
  }
  void* place(const void* host, std::size_t bytes) {
    Copy c{host, nullptr, bytes};
    if (cudaMalloc(&c.device, std::max<std::size_t>(bytes, 16)) != cudaSuccess) return nullptr;
    cudaMemcpy(c.device, host, bytes, cudaMemcpyHostToDevice);
    copies_.push_back(c);
    return c.device;
  }
  Batch::Place placer() {
    return [this](const void* host, std::size_t bytes) { return place(host, bytes); };
  }
  // The device copy of `host` back into it.
  void fetch(void* host) const {
    for (const Copy& c : copies_) {
      if (c.host == host) cudaMemcpy(host, c.device, c.bytes, cudaMemcpyDeviceToHost);
    }
  }
  // `host`'s bytes (changed since) up again.
  void refresh(const void* host) const {
    for (const Copy& c : copies_) {
      if (c.host == host) cudaMemcpy(c.device, host, c.bytes, cudaMemcpyHostToDevice);
    }
  }

 private:
  struct Copy {
    const void* host;
    void* device;
    std::size_t bytes;
  };
  std::vector<Copy> copies_;
};

void run_on_device(Attention& op, const Batch& batch, std::vector<std::uint8_t>& o, std::vector<float>& lse) {
  DeviceCopies dev;
  op.run(batch.args(o, lse, dev.placer()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.fetch(o.data());
  dev.fetch(lse.data());
}

// The batch on the plan's kernel and on each other kernel that accepts it (the registry's), each checked; a
// cut call (one block per launch) gives the whole call's bits.
void check_on_every_kernel(const Batch& batch, const BatchSpec& s) {
  std::vector<std::string> seen;
  std::vector<std::string> plans{""};
  for (const std::string& k : plan_kernel_names()) plans.push_back("kernel=" + k);
  for (const std::string& plan : plans) {
    const Attention probe(batch.problem(), cuda_config(plan));
    const std::string shown = probe.describe().substr(0, probe.describe().find(' '));
    if (std::find(seen.begin(), seen.end(), shown) != seen.end()) continue;  // (declined: the plan's kernel again)
    seen.push_back(shown);
    SCOPED_TRACE(probe.describe());
    const auto whole = check_batch(batch, s, cuda_config(plan), run_on_device);
    AttentionProblem cut_problem = batch.problem();
    cut_problem.work_budget = 1;
    std::vector<std::uint8_t> o = batch.output_buffer();
    std::vector<float> lse = batch.lse_buffer();
    Attention cut(cut_problem, cuda_config(plan));
    run_on_device(cut, batch, o, lse);
    EXPECT_EQ(o, whole) << "a cut call differs from the whole call: " << cut.describe();
  }
  if (s.dtype != DType::f32 && s.kv_type == KvType::Float) {
    EXPECT_GE(seen.size(), 2u) << "the SIMT and mma.sync kernels both take float16 / bfloat16 sequences";
  }
}

TEST(CudaSequences, RaggedBatchesMatchEachSequenceAloneOnEveryKernel) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (int variant = 0; variant < 6; ++variant) {
      BatchSpec s = ragged_variant(rng, t, variant, {64, 128, 32, 90, 300, 400});
      if (variant == 3) s.ragged_k = false;  // ragged queries over padded keys with key lengths
      check_on_every_kernel(Batch(s, 100 + variant), s);
    }
  }
}

TEST(CudaSequences, PagedKvMatchesEachSequenceAloneOnEveryKernel) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  for (std::int64_t page : {1, 3, 8, 16, 32, 64, 128, 256}) {
    for (int variant = 0; variant < 5; ++variant) {
      BatchSpec s;
      s.dtype = variant == 1 ? DType::bf16 : variant == 2 ? DType::f32 : DType::f16;
      s.page_size = page;
      s.heads_before_pages_rows = variant % 2 == 1;
      s.shared_prefix = variant == 0;
      s.heads = 8;
      s.kv_heads = 2;
      s.head_dim = s.v_head_dim = variant == 3 ? 96 : 128;
      if (variant == 4) s.v_head_dim = 128, s.head_dim = 192;  // MLA prefill's dims: the wgmma kernel's V boxes skip
      s.ragged_q = variant != 1;  // variant 1: a decode step, one query per sequence
      s.ragged_k = false;
      s.k_lens = random_lengths(rng, 5, 700);
      s.q_lens = variant == 1 ? std::vector<std::int64_t>(5, 1) : random_lengths(rng, 5, 40);
      s.causal = variant != 2;
      if (variant == 3) s.softcap = 30.0f;
      if (variant == 0) s.window = 100;  // (a block's first key off the tiles' start: the row offset in a page)
      check_on_every_kernel(Batch(s, 40 + page + variant), s);
    }
  }
}

// A paged decode step (one query per sequence, dense queries) whose key split streams on the wgmma kernel (forced
// here) runs on its plain build as a split tail (sm_90): each piece ends at its sequence's length and reads its pages box by
// box. Against each sequence alone, a cut call equal to the whole, and the general build's bytes (off=plain);
// pages of 8 to 256 keys, both page layouts, lengths from 0 to 3,000.
TEST(CudaSequences, PagedDecodeOnThePlainBuildGivesTheGeneralBuildsBits) {
  SKIP_WITHOUT_GPU();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0));
  const bool hopper = prop.major == 9 && prop.minor == 0 && testing::forced_plan().empty();
  std::mt19937 rng(23);
  for (std::int64_t page : {8, 16, 64, 256}) {
    for (DType t : {DType::f16, DType::bf16}) {
      BatchSpec s;
      s.dtype = t;
      s.page_size = page;
      s.heads_before_pages_rows = t == DType::bf16;
      s.heads = 32;
      s.kv_heads = 8;
      s.head_dim = s.v_head_dim = 128;
      s.ragged_q = s.ragged_k = false;
      s.k_lens = random_lengths(rng, 6, 3000);
      s.k_lens[1] = 0;
      s.q_lens = std::vector<std::int64_t>(6, 1);
      s.causal = true;
      const Batch batch(s, 70 + page);
      // (forced: six sequences of 8 K/V heads take mma.sync's cluster merge by default)
      const Attention plain(batch.problem(), cuda_config("kernel=wgmma"));
      SCOPED_TRACE(plain.describe());
      if (hopper) EXPECT_NE(plain.describe().find("plain, tail of"), std::string::npos);
      const auto plain_bytes = check_batch(batch, s, cuda_config("kernel=wgmma"), run_on_device);
      AttentionProblem cut_problem = batch.problem();
      cut_problem.work_budget = 1;
      std::vector<std::uint8_t> o = batch.output_buffer();
      std::vector<float> lse = batch.lse_buffer();
      Attention cut(cut_problem, cuda_config("kernel=wgmma"));
      run_on_device(cut, batch, o, lse);
      EXPECT_EQ(o, plain_bytes) << "a cut call differs from the whole call";
      EXPECT_EQ(check_batch(batch, s, cuda_config("kernel=wgmma,off=plain"), run_on_device), plain_bytes);
    }
  }
}

TEST(CudaSequences, QuantizedPages) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  for (KvType type : {KvType::Int8, KvType::Int4}) {
    for (KvQuant quant : {KvQuant::PerTensor, KvQuant::PerChannel}) {
      BatchSpec s;
      s.dtype = DType::f16;
      s.kv_type = type;
      s.kv_quant = quant;
      s.page_size = 32;
      s.head_dim = s.v_head_dim = 64;
      s.ragged_k = false;
      s.k_lens = random_lengths(rng, 4, 300);
      s.q_lens = random_lengths(rng, 4, 20);
      s.causal = true;
      check_on_every_kernel(Batch(s, 9), s);
    }
  }
}

// Runs `batch` on the device with a status word; returns the status and leaves O and lse in `o`, `lse`.
int run_with_status(const Batch& batch, const std::string& plan, std::vector<std::uint8_t>& o,
                    std::vector<float>& lse) {
  DeviceCopies dev;
  AttentionArgs args = batch.args(o, lse, dev.placer());
  int status_host = 12345;
  args.status = {dev.place(&status_host, sizeof(int)), 1};
  Attention op(batch.problem(), cuda_config(plan));
  op.run(args);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.fetch(o.data());
  dev.fetch(lse.data());
  dev.fetch(&status_host);
  return status_host;
}

// Out-of-range device values cannot throw: the entry they belong to gives masked rows (its keys cannot be read)
// or none of its rows (its queries cannot be placed), the status word names the lowest such entry, and every
// other entry's rows are the bytes of a call without the bad value.
TEST(CudaSequences, OutOfRangeDeviceValuesMaskTheirEntryAndAreReported) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  enum class Corrupt { CuSeqlensK, CuSeqlensQ, BlockTable, KeyLength };
  for (const Corrupt what : {Corrupt::CuSeqlensK, Corrupt::CuSeqlensQ, Corrupt::BlockTable, Corrupt::KeyLength}) {
    for (const std::string plan : {"kernel=simt", "kernel=mma", "kernel=wgmma"}) {
      BatchSpec s;
      s.dtype = DType::f16;
      s.head_dim = s.v_head_dim = 64;
      s.q_lens = {5, 7, 3, 6};
      s.k_lens = {90, 200, 150, 70};
      s.causal = true;
      if (what == Corrupt::BlockTable || what == Corrupt::KeyLength) s.page_size = 16, s.ragged_k = false;
      Batch batch(s, 77);
      SCOPED_TRACE(describe(s) + " " + plan + " corrupt " + std::to_string(static_cast<int>(what)));
      std::vector<std::uint8_t> good_o = batch.output_buffer(), o = batch.output_buffer();
      std::vector<float> good_lse = batch.lse_buffer(), lse = batch.lse_buffer();
      EXPECT_EQ(run_with_status(batch, plan, good_o, good_lse), -1);
      std::int64_t bad = 0;
      bool nan = true;
      switch (what) {
        case Corrupt::CuSeqlensK: bad = 3, batch.cu_seqlens_k()[4] = 1 << 30; break;       // past total_k
        case Corrupt::CuSeqlensQ: bad = 3, nan = false, batch.cu_seqlens_q()[4] += 1000; break;  // past total_q
        case Corrupt::BlockTable: bad = 1, batch.block_table()[batch.problem().sequences.max_pages_per_seq + 2] = -4; break;
        case Corrupt::KeyLength: bad = 2, batch.key_lengths()[2] = 100000; break;
      }
      EXPECT_EQ(run_with_status(batch, plan, o, lse), bad);
      EXPECT_TRUE(rows_are(batch, s, o, bad, nan)) << (nan ? "not masked rows" : "written");
      for (std::int64_t b = 0; b < 4; ++b) {
        if (b == bad) continue;
        for (std::int64_t i = 0; i < s.q_lens[b]; ++i) {
          const std::size_t row_bytes = static_cast<std::size_t>(s.heads * s.v_head_dim) * dtype_size(s.dtype);
          const std::size_t at = static_cast<std::size_t>(batch.query_row(b, i)) * row_bytes;
          EXPECT_EQ(std::memcmp(&o[at], &good_o[at], row_bytes), 0) << "entry " << b << " changed";
        }
      }
      // Rows no entry owns (past the last entry) keep their bytes whatever the values.
      const std::size_t tail = static_cast<std::size_t>(batch.query_row(3, s.q_lens[3])) * s.heads * s.v_head_dim *
                               dtype_size(s.dtype);
      EXPECT_EQ(std::vector<std::uint8_t>(o.begin() + static_cast<std::ptrdiff_t>(std::min(tail, o.size())), o.end()),
                std::vector<std::uint8_t>(good_o.begin() + static_cast<std::ptrdiff_t>(std::min(tail, o.size())), good_o.end()));
    }
  }
}

// A paged decode step and a ragged prefill capture in a CUDA graph in the strict (global) mode, with caller
// scratch; the replay after new key lengths, block tables and cu_seqlens are written into the same buffers gives
// the eager call's bytes (whose agreement with the reference the tests above check).
TEST(CudaSequences, CaptureInAStrictGraphAndReplayWithNewArrays) {
  SKIP_WITHOUT_GPU();
  for (const bool paged : {true, false}) {
    BatchSpec s;
    s.dtype = DType::bf16;
    s.heads = 32;
    s.kv_heads = 8;
    s.head_dim = s.v_head_dim = 128;
    s.k_lens = {3000, 17, 900, 4096, 1};
    s.q_lens = paged ? std::vector<std::int64_t>(5, 1) : std::vector<std::int64_t>{40, 1, 300, 64, 0};
    s.ragged_q = !paged;
    s.ragged_k = !paged;
    s.page_size = paged ? 16 : 0;
    s.causal = true;
    Batch batch(s, 21);
    SCOPED_TRACE(describe(s));
    Attention op(batch.problem(), cuda_config(""));
    DeviceCopies dev;
    std::vector<std::uint8_t> o = batch.output_buffer();
    std::vector<float> lse = batch.lse_buffer();
    AttentionArgs args = batch.args(o, lse, dev.placer());
    std::vector<std::uint8_t> scratch_host(std::max<std::size_t>(op.scratch_bytes(), 1));
    args.scratch = dev.place(scratch_host.data(), scratch_host.size());
    args.scratch_bytes = op.scratch_bytes();
    cudaStream_t stream{};
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    args.stream = stream;
    cudaGraph_t graph{};
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    op.run(args);
    check(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec{};
    check(cudaGraphInstantiate(&exec, graph, 0));
    // New arrays in the same buffers: shorter and longer keys (paged: the pages reversed), other query counts.
    if (paged) {
      for (auto& n : batch.key_lengths()) n = std::max(1, 4096 - n);
      auto& table = batch.block_table();
      const std::int64_t per = batch.problem().sequences.max_pages_per_seq;
      for (std::int64_t b = 0; b < 5; ++b) std::reverse(table.begin() + b * per, table.begin() + (b + 1) * per);
      // (every entry a key reaches stays a page: the spare column is the last one, now first)
      for (auto& e : table) e = e < 0 ? 0 : e;
    } else {
      auto& cu_k = batch.cu_seqlens_k();
      auto& cu_q = batch.cu_seqlens_q();
      // Same totals, the sequences' split points moved.
      cu_k[1] = 1000, cu_k[2] = 1001, cu_k[3] = 5000;
      cu_q[1] = 2, cu_q[2] = 250, cu_q[3] = 300;
    }
    for (const void* a : {static_cast<const void*>(batch.key_lengths().data()), static_cast<const void*>(batch.block_table().data()),
                          static_cast<const void*>(batch.cu_seqlens_k().data()), static_cast<const void*>(batch.cu_seqlens_q().data())}) {
      dev.refresh(a);
    }
    check(cudaGraphLaunch(exec, stream));
    check(cudaStreamSynchronize(stream));
    dev.fetch(o.data());
    const std::vector<std::uint8_t> replayed = o;
    const std::vector<std::uint8_t> poison = batch.output_buffer();
    std::copy(poison.begin(), poison.end(), o.begin());  // (in place: the device copy is found by its address)
    dev.refresh(o.data());
    op.run(args);
    check(cudaStreamSynchronize(stream));
    dev.fetch(o.data());
    EXPECT_EQ(replayed, o) << "graph replay differs from the eager call";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

}  // namespace
}  // namespace attnkit
