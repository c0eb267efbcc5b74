// The GQA op's optional output_qk on the GPU: the scores of every query row against every token of its sequence,
// before the softmax (softcap(scale * q.k) + bias) or after it (the probabilities, the sink in the denominator),
// 0 where the row sees no key. The same float64 arithmetic as the CPU's gqa::write_output_qk (output_qk.cpp), in
// the same order per score (the dot product over d in order), so both backends write the same values up to the
// last bit of a float64 exp / tanh: a debugging output, simple rather than fast (one block per query row, the
// scores computed again for each pass of the softmax).
#include "cuda/host/kernel_launchers.hpp"

#include <cuda_runtime.h>

namespace attnkit::cuda {
namespace {

constexpr int kThreads = 256;

// The block's fixed-order tree reduction of one double per thread (max or sum).
template <class Op>
__device__ double block_reduce(double x, double* scratch, Op op) {
  scratch[threadIdx.x] = x;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) scratch[threadIdx.x] = op(scratch[threadIdx.x], scratch[threadIdx.x + half]);
    __syncthreads();
  }
  const double result = scratch[0];
  __syncthreads();
  return result;
}

template <class T>
__global__ void __launch_bounds__(kThreads) output_qk_kernel(const KernelParams p, bool after_softmax,
                                                             const std::int32_t* first_column, std::int64_t columns,
                                                             T* out) {
  __shared__ double scratch[kThreads];
  const std::int64_t row = blockIdx.x;  // (b, h, i)
  const std::int64_t i = row % p.q_len;
  const std::int64_t h = (row / p.q_len) % p.heads;
  const std::int64_t b = row / (p.q_len * p.heads);
  const std::int64_t kvh = h / p.group;
  const core::KeyRange range = p.rule.for_batch(p.causal_offsets, b).for_row(i, key_length_of(p, b));
  const std::int64_t first = first_column[b];
  const T* q = static_cast<const T*>(p.q) + p.lq.index(b, h, i);
  auto score = [&](std::int64_t j) {
    double dot = 0.0;
    const std::int64_t k_row = p.lk.index(b, kvh, j);
    for (std::int64_t d = 0; d < p.head_dim; ++d) {
      dot += static_cast<double>(to_float(q[d])) *
             static_cast<double>(load_kv_value<T>(p.k, p.k_type, p.k_quant, p.k_scale, kvh, p.head_dim, k_row, d));
    }
    double s = p.transform.apply(dot);
    if (p.has_mask) s += static_cast<double>(load_mask(p, p.lmask.index(b, h, i) + j));
    return s;
  };
  const double kInf = __longlong_as_double(0x7ff0000000000000LL);
  double max = -kInf, sum = 0.0;
  if (after_softmax && !range.empty()) {
    double m = -kInf;
    for (std::int64_t j = range.begin + threadIdx.x; j < range.end; j += kThreads) {
      const double s = score(j);
      m = m < s ? s : m;  // std::max's rule: a NaN score leaves the max where it was, as on the CPU
    }
    max = block_reduce(m, scratch, [](double x, double y) { return x < y ? y : x; });
    const double sink = p.has_sink ? static_cast<double>(p.sinks[h]) : -kInf;
    max = max < sink ? sink : max;
    double part = 0.0;
    for (std::int64_t j = range.begin + threadIdx.x; j < range.end; j += kThreads) {
      const double s = score(j);
      part += s == -kInf ? 0.0 : exp(s - max);
    }
    sum = block_reduce(part, scratch, [](double x, double y) { return x + y; });
    if (p.has_sink) sum += exp(sink - max);
  }
  T* o = out + row * columns;
  for (std::int64_t c = threadIdx.x; c < columns; c += kThreads) {
    const std::int64_t j = c - first;
    double x = 0.0;
    if (j >= range.begin && j < range.end) {
      x = score(j);
      if (after_softmax) {
        x = x == -kInf ? 0.0 : exp(x - max);
        x = sum > 0.0 ? x / sum : 0.0;  // every key hidden by a -inf bias and no sink: the core's zero row
      }
    }
    o[c] = from_float<T>(static_cast<float>(x));
  }
}

}  // namespace

void launch_output_qk(const KernelParams& p, DType dtype, bool after_softmax, const std::int32_t* first_column,
                      std::int64_t columns, void* out, cudaStream_t stream) {
  const auto rows = static_cast<unsigned>(p.batch * p.heads * p.q_len);
  if (rows == 0 || columns == 0) return;
  switch (dtype) {
    case DType::f32:
      output_qk_kernel<float><<<rows, kThreads, 0, stream>>>(p, after_softmax, first_column, columns, static_cast<float*>(out));
      break;
    case DType::f16:
      output_qk_kernel<__half><<<rows, kThreads, 0, stream>>>(p, after_softmax, first_column, columns, static_cast<__half*>(out));
      break;
    case DType::bf16:
      output_qk_kernel<__nv_bfloat16>
          <<<rows, kThreads, 0, stream>>>(p, after_softmax, first_column, columns, static_cast<__nv_bfloat16*>(out));
      break;
  }
}

}  // namespace attnkit::cuda
