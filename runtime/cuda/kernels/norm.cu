// Layer norm, eval-mode batch norm backward and SyncBatchNorm kernels; see
// norm.h (the SyncBatchNorm reductions are described before their code).
//
// Layer norm: one block per row (rows in a grid-stride loop), the block's
// threads striding over the row in 16-byte vectors when the row length and
// the pointers allow it. Statistics: each thread runs Welford's update over
// its elements; the partial (count, mean, M2) triples are merged across the
// block with Chan's formula, which does not cancel the way E[x^2] - E[x]^2
// does when |mean| >> std. The weight/bias gradients are column sums over
// rows: blocks of 32 columns x one chunk of rows write f64 partial sums, and
// a second kernel adds a column's partials in chunk order (deterministic).
#include "lockstep/runtime/cuda/kernels/norm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "lockstep/runtime/cuda/kernels/block_reduce.cuh"
#include "lockstep/runtime/cuda/kernels/device_types.cuh"

namespace lockstep::runtime::cuda::kernels {
namespace {

constexpr int kMaxRowThreads = 512;
constexpr int64_t kMaxGrid = int64_t{1} << 20;

template <class A>
struct Welford {
  A mean, m2, count;
};

template <class A>
struct MergeWelford {
  __device__ Welford<A> operator()(const Welford<A>& a, const Welford<A>& b) const {
    const A n = a.count + b.count;
    if (n == A(0)) return a;
    const A delta = b.mean - a.mean;
    const A wb = b.count / n;
    return {a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.count * wb, n};
  }
};

template <class A>
struct Pair {
  A a, b;
};

template <class A>
struct AddPair {
  __device__ Pair<A> operator()(const Pair<A>& x, const Pair<A>& y) const {
    return {x.a + y.a, x.b + y.b};
  }
};

__device__ __forceinline__ float inv_sqrt(float v) { return 1.0f / sqrtf(v); }
__device__ __forceinline__ double inv_sqrt(double v) { return 1.0 / sqrt(v); }

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Threads for a row of `units` vectors: one vector each up to kMaxRowThreads,
// whole warps.
int row_threads(int64_t units) {
  const int64_t t = (units + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > kMaxRowThreads ? kMaxRowThreads : t));
}

unsigned grid_rows(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxGrid ? rows : kMaxGrid);
}

// ---- layer norm forward ----------------------------------------------------

template <class T, int V>
__global__ void layer_norm_forward_kernel(int64_t rows, int64_t d, const T* __restrict__ x,
                                          const T* __restrict__ w, const T* __restrict__ b,
                                          compute_t<T> eps, T* __restrict__ y,
                                          compute_t<T>* __restrict__ mean_out,
                                          compute_t<T>* __restrict__ invstd_out) {
  using A = compute_t<T>;
  __shared__ Welford<A> smem[33];
  const int64_t units = d / V;  // d % V == 0 (V > 1 only then)
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * d;
    T* yr = y + row * d;
    Welford<A> s{A(0), A(0), A(0)};
    for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
      const AlignedVec<T, V> xv = load_vec<V>(xr, k);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const A v = convert<A>(xv.v[i]);
        s.count += A(1);
        const A delta = v - s.mean;
        s.mean += delta / s.count;
        s.m2 += delta * (v - s.mean);
      }
    }
    s = block_allreduce(s, MergeWelford<A>{}, Welford<A>{A(0), A(0), A(0)}, smem);
    const A mu = s.mean;
    const A var = s.m2 > A(0) ? s.m2 / static_cast<A>(d) : A(0);
    const A rstd = inv_sqrt(var + eps);
    if (threadIdx.x == 0) {
      mean_out[row] = mu;
      invstd_out[row] = rstd;
    }
    for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
      const AlignedVec<T, V> xv = load_vec<V>(xr, k);
      AlignedVec<T, V> wv, bv, yv;
      if (w != nullptr) wv = load_vec<V>(w, k);
      if (b != nullptr) bv = load_vec<V>(b, k);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        A v = (convert<A>(xv.v[i]) - mu) * rstd;
        if (w != nullptr) v *= convert<A>(wv.v[i]);
        if (b != nullptr) v += convert<A>(bv.v[i]);
        yv.v[i] = convert<T>(v);
      }
      store_vec<V>(yr, k, yv);
    }
  }
}

// ---- layer norm backward: input --------------------------------------------

template <class T, int V>
__global__ void layer_norm_backward_input_kernel(int64_t rows, int64_t d,
                                                 const T* __restrict__ gy,
                                                 const T* __restrict__ x,
                                                 const T* __restrict__ w,
                                                 const compute_t<T>* __restrict__ mean,
                                                 const compute_t<T>* __restrict__ invstd,
                                                 T* __restrict__ gx) {
  using A = compute_t<T>;
  __shared__ Pair<A> smem[33];
  const int64_t units = d / V;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* gyr = gy + row * d;
    const T* xr = x + row * d;
    const A mu = mean[row], rstd = invstd[row];
    // Sums of g = gy * w and of g * xhat over the row.
    Pair<A> s{A(0), A(0)};
    for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
      const AlignedVec<T, V> gv = load_vec<V>(gyr, k);
      const AlignedVec<T, V> xv = load_vec<V>(xr, k);
      AlignedVec<T, V> wv;
      if (w != nullptr) wv = load_vec<V>(w, k);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        A g = convert<A>(gv.v[i]);
        if (w != nullptr) g *= convert<A>(wv.v[i]);
        const A xhat = (convert<A>(xv.v[i]) - mu) * rstd;
        s.a += g;
        s.b += g * xhat;
      }
    }
    s = block_allreduce(s, AddPair<A>{}, Pair<A>{A(0), A(0)}, smem);
    const A mean_g = s.a / static_cast<A>(d), mean_gx = s.b / static_cast<A>(d);
    T* gxr = gx + row * d;
    for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
      const AlignedVec<T, V> gv = load_vec<V>(gyr, k);
      const AlignedVec<T, V> xv = load_vec<V>(xr, k);
      AlignedVec<T, V> wv, out;
      if (w != nullptr) wv = load_vec<V>(w, k);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        A g = convert<A>(gv.v[i]);
        if (w != nullptr) g *= convert<A>(wv.v[i]);
        const A xhat = (convert<A>(xv.v[i]) - mu) * rstd;
        out.v[i] = convert<T>(rstd * (g - mean_g - xhat * mean_gx));
      }
      store_vec<V>(gxr, k, out);
    }
  }
}

// ---- layer norm backward: weight and bias ----------------------------------

constexpr int kColTile = 32;  // columns per block (one warp across)
constexpr int kRowLanes = 8;  // rows read at once per block

// Block (kColTile, kRowLanes), grid (column tiles, chunks): partial sums of
// gy * xhat and gy over rows [chunk * rows_per_chunk, ...) for each column.
template <class T>
__global__ void layer_norm_param_partials(int64_t rows, int64_t d, int64_t rows_per_chunk,
                                          const T* __restrict__ gy, const T* __restrict__ x,
                                          const compute_t<T>* __restrict__ mean,
                                          const compute_t<T>* __restrict__ invstd,
                                          double* __restrict__ part_w,
                                          double* __restrict__ part_b) {
  using A = compute_t<T>;
  __shared__ A sw[kRowLanes][kColTile + 1];
  __shared__ A sb[kRowLanes][kColTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  A acc_w = A(0), acc_b = A(0);
  if (col < d) {
    for (int64_t r = r0 + ty; r < r1; r += kRowLanes) {
      const A g = convert<A>(gy[r * d + col]);
      const A xhat = (convert<A>(x[r * d + col]) - mean[r]) * invstd[r];
      acc_w += g * xhat;
      acc_b += g;
    }
  }
  sw[ty][tx] = acc_w;
  sb[ty][tx] = acc_b;
  __syncthreads();
  if (ty == 0 && col < d) {
    double tw = 0, tb = 0;
#pragma unroll
    for (int i = 0; i < kRowLanes; ++i) {
      tw += static_cast<double>(sw[i][tx]);
      tb += static_cast<double>(sb[i][tx]);
    }
    part_w[blockIdx.y * d + col] = tw;
    part_b[blockIdx.y * d + col] = tb;
  }
}

template <class T>
__global__ void layer_norm_param_finish(int64_t d, int64_t chunks,
                                        const double* __restrict__ part_w,
                                        const double* __restrict__ part_b, T* __restrict__ gw,
                                        T* __restrict__ gb) {
  for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < d;
       col += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double tw = 0, tb = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      tw += part_w[c * d + col];
      tb += part_b[c * d + col];
    }
    if (gw != nullptr) gw[col] = convert<T>(tw);
    if (gb != nullptr) gb[col] = convert<T>(tb);
  }
}

// ---- batch norm, eval mode ---------------------------------------------------

// out = (in - mean[ch]) * w[ch] * invstd[ch] + b[ch], with mean, w
// and b optional (0, 1, 0): the eval forward, and with in = gy, no mean and
// no b, the eval input gradient.
template <class T>
__global__ void batch_norm_eval_affine_kernel(int64_t total, int64_t c, int64_t inner,
                                              const T* __restrict__ in, const T* __restrict__ w,
                                              const T* __restrict__ b,
                                              const T* __restrict__ mean,
                                              const T* __restrict__ invstd,
                                              T* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ch = (i / inner) % c;
    const T k = (w != nullptr ? w[ch] : T(1)) * invstd[ch];
    out[i] = (in[i] - (mean != nullptr ? mean[ch] : T(0))) * k + (b != nullptr ? b[ch] : T(0));
  }
}

// One block per channel (channels in a grid-stride loop). Sums in f64, as
// the CPU op and SyncBatchNorm's reductions: a channel may hold millions of
// values.
template <class T>
__global__ void batch_norm_eval_params_kernel(int64_t n, int64_t c, int64_t inner,
                                              const T* __restrict__ gy, const T* __restrict__ x,
                                              const T* __restrict__ mean,
                                              const T* __restrict__ invstd,
                                              T* __restrict__ gw, T* __restrict__ gb) {
  __shared__ Pair<double> smem[33];
  const int64_t count = n * inner;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const double m = static_cast<double>(mean[ch]);
    Pair<double> s{0.0, 0.0};
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
      const int64_t img = j / inner;
      const int64_t idx = (img * c + ch) * inner + (j - img * inner);
      const double g = static_cast<double>(gy[idx]);
      s.a += g;
      s.b += g * (static_cast<double>(x[idx]) - m);
    }
    s = block_allreduce(s, AddPair<double>{}, Pair<double>{0.0, 0.0}, smem);
    if (threadIdx.x == 0) {
      const double k = static_cast<double>(invstd[ch]);
      if (gw != nullptr) gw[ch] = static_cast<T>(s.b * k);
      if (gb != nullptr) gb[ch] = static_cast<T>(s.a);
    }
  }
}

// ---- SyncBatchNorm: per-channel reductions ----------------------------------
//
// Channel ch's values are x[(img * c + ch) * inner + k], img < n, k < inner,
// numbered j = img * inner + k; chunk q holds j in [q * per_chunk, (q + 1) *
// per_chunk). Two block shapes:
//   planes (inner > 1): block (ch, q), 256 threads striding over the chunk's
//     j, a warp reading consecutive values of a plane; block_allreduce.
//   rows (inner == 1, x is [n, c]): block (32 channels, q) of 32 x 8 threads,
//     a warp reading 32 adjacent channels of one row (coalesced); the 8 row
//     lanes are merged in order through shared memory.
// Each block writes one partial per channel to part[q * c + ch]; a finishing
// kernel (one thread per channel) combines q = 0, 1, ... in order.

__device__ __forceinline__ void welford_add(Welford<double>& s, double v) {
  s.count += 1.0;
  const double delta = v - s.mean;
  s.mean += delta / s.count;
  s.m2 += delta * (v - s.mean);
}

// What the reductions accumulate: `center(ch)` is read once per channel and
// passed to every add().
template <class T>
struct StatsAcc {
  using Part = Welford<double>;
  using Merge = MergeWelford<double>;
  const T* x;
  __device__ double center(int64_t) const { return 0.0; }
  __device__ void add(Part& p, int64_t i, double) const {
    welford_add(p, static_cast<double>(x[i]));
  }
};

template <class T>
struct GradSumsAcc {
  using Part = Pair<double>;  // a: sum(gy), b: sum(gy * (x - mean))
  using Merge = AddPair<double>;
  const T* gy;
  const T* x;
  const double* mean;
  __device__ double center(int64_t ch) const { return mean[ch]; }
  __device__ void add(Part& p, int64_t i, double m) const {
    const double g = static_cast<double>(gy[i]);
    p.a += g;
    p.b += g * (static_cast<double>(x[i]) - m);
  }
};

template <class Acc>
__global__ void channel_partials_planes(int64_t n, int64_t c, int64_t inner, int64_t per_chunk,
                                        Acc acc, typename Acc::Part* __restrict__ part) {
  using Part = typename Acc::Part;
  __shared__ Part smem[33];
  const int64_t count = n * inner;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * per_chunk;
  const int64_t j1 = j0 + per_chunk < count ? j0 + per_chunk : count;
  // j advances by blockDim.x: (img, k) by (step_img, step_k), carrying at
  // most once, so there is no division in the loop.
  const int64_t step = blockDim.x;
  const int64_t step_img = step / inner, step_k = step % inner;
  const int64_t first = j0 + threadIdx.x;
  const int64_t img0 = first / inner, k0 = first - img0 * inner;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const double m = acc.center(ch);
    Part p{};
    int64_t img = img0, k = k0;
    for (int64_t j = first; j < j1; j += step) {
      acc.add(p, (img * c + ch) * inner + k, m);
      img += step_img;
      k += step_k;
      if (k >= inner) {
        k -= inner;
        ++img;
      }
    }
    p = block_allreduce(p, typename Acc::Merge{}, Part{}, smem);
    if (threadIdx.x == 0) part[static_cast<int64_t>(blockIdx.y) * c + ch] = p;
  }
}

constexpr int kTileChannels = 32;
constexpr int kTileRows = 8;

template <class Acc>
__global__ void channel_partials_rows(int64_t n, int64_t c, int64_t per_chunk, Acc acc,
                                      typename Acc::Part* __restrict__ part) {
  using Part = typename Acc::Part;
  __shared__ Part smem[kTileRows][kTileChannels];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kTileChannels + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * per_chunk;
  const int64_t r1 = r0 + per_chunk < n ? r0 + per_chunk : n;
  Part p{};
  if (ch < c) {
    const double m = acc.center(ch);
    for (int64_t r = r0 + ty; r < r1; r += kTileRows) acc.add(p, r * c + ch, m);
  }
  smem[ty][tx] = p;
  __syncthreads();
  if (ty == 0 && ch < c) {
    const typename Acc::Merge merge{};
    for (int i = 1; i < kTileRows; ++i) p = merge(p, smem[i][tx]);
    part[static_cast<int64_t>(blockIdx.y) * c + ch] = p;
  }
}

// Partials of `chunks` (> 0) chunks per channel into `workspace`.
template <class Acc>
cudaError_t launch_channel_partials(int64_t n, int64_t c, int64_t inner, int64_t chunks,
                                    const Acc& acc, void* workspace, cudaStream_t stream) {
  auto* part = static_cast<typename Acc::Part*>(workspace);
  if (inner == 1) {
    const int64_t per_chunk = (n + chunks - 1) / chunks;
    const dim3 grid(static_cast<unsigned>((c + kTileChannels - 1) / kTileChannels),
                    static_cast<unsigned>(chunks));
    channel_partials_rows<Acc><<<grid, dim3(kTileChannels, kTileRows), 0, stream>>>(
        n, c, per_chunk, acc, part);
  } else {
    const int64_t per_chunk = (n * inner + chunks - 1) / chunks;
    const dim3 grid(static_cast<unsigned>(c < kMaxGrid ? c : kMaxGrid),
                    static_cast<unsigned>(chunks));
    channel_partials_planes<Acc><<<grid, kBlock, 0, stream>>>(n, c, inner, per_chunk, acc, part);
  }
  return cudaGetLastError();
}

// mean, var and count may lie in one packed buffer: no __restrict__.
__global__ void channel_stats_finish(int64_t c, int64_t chunks,
                                     const Welford<double>* __restrict__ part, double* mean,
                                     double* var, double* count_out, double count) {
  const MergeWelford<double> merge{};
  for (int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; ch < c;
       ch += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Welford<double> s{0.0, 0.0, 0.0};
    // Not unrolled: nvcc 13.0, unrolling this loop by 4, loaded the 2nd to
    // 4th partials' mean from their count's address (seen in its PTX; on an
    // H100 every channel of 4 or more chunks got a mean near the count).
#pragma unroll 1
    for (int64_t q = 0; q < chunks; ++q) s = merge(s, part[q * c + ch]);
    mean[ch] = s.mean;  // 0 without values
    var[ch] = s.count > 0.0 ? fmax(s.m2 / s.count, 0.0) : 0.0;
  }
  if (count_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *count_out = count;
}

template <class T>
__global__ void channel_grad_sums_finish(int64_t c, int64_t chunks,
                                         const Pair<double>* __restrict__ part,
                                         const double* invstd, double* sum_gy, double* sum_gy_xc,
                                         T* __restrict__ gw, T* __restrict__ gb) {
  for (int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; ch < c;
       ch += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double a = 0, b = 0;
    for (int64_t q = 0; q < chunks; ++q) {
      a += part[q * c + ch].a;
      b += part[q * c + ch].b;
    }
    sum_gy[ch] = a;
    sum_gy_xc[ch] = b;
    if (gw != nullptr) gw[ch] = static_cast<T>(b * invstd[ch]);
    if (gb != nullptr) gb[ch] = static_cast<T>(a);
  }
}

// ---- SyncBatchNorm: per-channel coefficients ---------------------------------

// One thread per channel; every thread sums the world's counts itself (world
// is small), so no thread waits for another.
template <class T>
__global__ void sync_batch_norm_combine_kernel(int world, int64_t c,
                                               const double* __restrict__ gathered, double eps,
                                               double momentum, const T* __restrict__ w,
                                               const T* __restrict__ b, T* __restrict__ rm,
                                               T* __restrict__ rv, double* __restrict__ stats,
                                               T* __restrict__ scale, T* __restrict__ shift) {
  const int64_t stride = 2 * c + 1;
  double n = 0;
  for (int r = 0; r < world; ++r) n += gathered[r * stride + 2 * c];
  if (blockIdx.x == 0 && threadIdx.x == 0) stats[2 * c] = n;
  for (int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; ch < c;
       ch += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double mean = 0, var = 0;
    if (n > 0) {
      for (int r = 0; r < world; ++r) {
        const double* g = gathered + r * stride;
        mean += g[2 * c] / n * g[ch];
      }
      for (int r = 0; r < world; ++r) {
        const double* g = gathered + r * stride;
        const double d = g[ch] - mean;
        var += g[2 * c] / n * (g[c + ch] + d * d);
      }
    }
    const double is = 1.0 / sqrt(var + eps);
    stats[ch] = mean;
    stats[c + ch] = is;
    const double wv = w != nullptr ? static_cast<double>(w[ch]) : 1.0;
    const double bv = b != nullptr ? static_cast<double>(b[ch]) : 0.0;
    scale[ch] = static_cast<T>(wv * is);
    shift[ch] = static_cast<T>(bv - mean * wv * is);
    // With a count <= 1 the host throws; the running statistics stay as they were.
    if (rm != nullptr && n > 1) {
      const double unbias = n / (n - 1);
      rm[ch] = static_cast<T>((1 - momentum) * static_cast<double>(rm[ch]) + momentum * mean);
      rv[ch] = static_cast<T>((1 - momentum) * static_cast<double>(rv[ch]) +
                              momentum * var * unbias);
    }
  }
}

template <class T>
__global__ void sync_batch_norm_coefficients_kernel(int64_t c, const double* __restrict__ sums,
                                                    const double* __restrict__ stats,
                                                    const T* __restrict__ w,
                                                    T* __restrict__ coef) {
  const double m = stats[2 * c];
  for (int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; ch < c;
       ch += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double is = stats[c + ch];
    const double ka = (w != nullptr ? static_cast<double>(w[ch]) : 1.0) * is;
    const double kb = -ka * is * is * sums[c + ch] / m;
    coef[ch] = static_cast<T>(ka);
    coef[c + ch] = static_cast<T>(kb);
    coef[2 * c + ch] = static_cast<T>(-ka * sums[ch] / m - kb * stats[ch]);
  }
}

// ---- SyncBatchNorm: per-element passes ---------------------------------------
//
// x as `planes` contiguous runs of `len`: [n*c planes of inner] with channel
// p % c, or for inner == 1 [n rows of c] with channel k. Threads x walk a
// run, threads y the runs; blockDim.x is the run length rounded up to a power
// of two (at most 256), so short runs still fill whole warps with adjacent
// runs, which lie next to each other in memory.

template <class F>
__global__ void channel_map_kernel(int64_t planes, int64_t len, int64_t c, bool rows, F f) {
  for (int64_t p = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; p < planes;
       p += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    const int64_t plane_ch = rows ? 0 : p % c;
    for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < len;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x)
      f(p * len + k, rows ? k : plane_ch);
  }
}

template <class T>
struct AffineFn {
  const T* __restrict__ x;
  const T* __restrict__ scale;
  const T* __restrict__ shift;
  T* __restrict__ y;
  __device__ void operator()(int64_t i, int64_t ch) const { y[i] = x[i] * scale[ch] + shift[ch]; }
};

template <class T>
struct GradInputFn {
  const T* __restrict__ gy;
  const T* __restrict__ x;
  const T* __restrict__ coef;  // [ka | kb | kc]
  int64_t c;
  T* __restrict__ gx;
  __device__ void operator()(int64_t i, int64_t ch) const {
    gx[i] = gy[i] * coef[ch] + x[i] * coef[c + ch] + coef[2 * c + ch];
  }
};

template <class F>
cudaError_t launch_channel_map(int64_t n, int64_t c, int64_t inner, const F& f,
                               cudaStream_t stream) {
  const bool rows = inner == 1;
  const int64_t planes = rows ? n : n * c, len = rows ? c : inner;
  if (planes == 0 || len == 0) return cudaSuccess;
  int bx = 1;
  while (bx < kBlock && bx < len) bx *= 2;
  const int by = kBlock / bx;
  const int64_t gx = (len + bx - 1) / bx, gy = (planes + by - 1) / by;
  const dim3 grid(static_cast<unsigned>(gx < kMaxGrid ? gx : kMaxGrid),
                  static_cast<unsigned>(gy < 65535 ? gy : 65535));
  channel_map_kernel<F><<<grid, dim3(bx, by), 0, stream>>>(planes, len, c, rows, f);
  return cudaGetLastError();
}

template <class Fn>
cudaError_t dispatch_f32_f64(ScalarType t, Fn&& fn) {
  switch (t) {
    case ScalarType::f32: return fn(float{});
    case ScalarType::f64: return fn(double{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t layer_norm_forward(ScalarType dtype, int64_t rows, int64_t d, const void* x,
                               const void* w, const void* b, double eps, void* y, void* mean,
                               void* invstd, cudaStream_t stream) {
  if (rows == 0 || d == 0) return cudaSuccess;
  return dispatch_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = compute_t<T>;
    constexpr int V = vec16_v<T>;
    const auto* xp = static_cast<const T*>(x);
    const auto* wp = static_cast<const T*>(w);
    const auto* bp = static_cast<const T*>(b);
    auto* yp = static_cast<T*>(y);
    auto* mp = static_cast<A*>(mean);
    auto* sp = static_cast<A*>(invstd);
    if (d % V == 0 && aligned16(x) && aligned16(w) && aligned16(b) && aligned16(y)) {
      layer_norm_forward_kernel<T, V><<<grid_rows(rows), row_threads(d / V), 0, stream>>>(
          rows, d, xp, wp, bp, static_cast<A>(eps), yp, mp, sp);
    } else {
      layer_norm_forward_kernel<T, 1><<<grid_rows(rows), row_threads(d), 0, stream>>>(
          rows, d, xp, wp, bp, static_cast<A>(eps), yp, mp, sp);
    }
    return cudaGetLastError();
  });
}

cudaError_t layer_norm_backward_input(ScalarType dtype, int64_t rows, int64_t d,
                                      const void* grad_y, const void* x, const void* w,
                                      const void* mean, const void* invstd, void* grad_x,
                                      cudaStream_t stream) {
  if (rows == 0 || d == 0) return cudaSuccess;
  return dispatch_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = compute_t<T>;
    constexpr int V = vec16_v<T>;
    const auto* gp = static_cast<const T*>(grad_y);
    const auto* xp = static_cast<const T*>(x);
    const auto* wp = static_cast<const T*>(w);
    const auto* mp = static_cast<const A*>(mean);
    const auto* sp = static_cast<const A*>(invstd);
    auto* gxp = static_cast<T*>(grad_x);
    if (d % V == 0 && aligned16(grad_y) && aligned16(x) && aligned16(w) && aligned16(grad_x)) {
      layer_norm_backward_input_kernel<T, V><<<grid_rows(rows), row_threads(d / V), 0, stream>>>(
          rows, d, gp, xp, wp, mp, sp, gxp);
    } else {
      layer_norm_backward_input_kernel<T, 1><<<grid_rows(rows), row_threads(d), 0, stream>>>(
          rows, d, gp, xp, wp, mp, sp, gxp);
    }
    return cudaGetLastError();
  });
}

cudaError_t layer_norm_backward_params(ScalarType dtype, int64_t rows, int64_t d,
                                       const void* grad_y, const void* x, const void* mean,
                                       const void* invstd, void* grad_w, void* grad_b,
                                       void* workspace, cudaStream_t stream) {
  if (d == 0 || (grad_w == nullptr && grad_b == nullptr)) return cudaSuccess;
  return dispatch_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = compute_t<T>;
    const int64_t chunks = rows == 0 ? 0 : layer_norm_param_chunks(rows);
    auto* part_w = static_cast<double*>(workspace);
    double* part_b = part_w + chunks * d;
    if (chunks > 0) {
      const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
      const dim3 grid(static_cast<unsigned>((d + kColTile - 1) / kColTile),
                      static_cast<unsigned>(chunks));
      layer_norm_param_partials<T><<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(
          rows, d, rows_per_chunk, static_cast<const T*>(grad_y), static_cast<const T*>(x),
          static_cast<const A*>(mean), static_cast<const A*>(invstd), part_w, part_b);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    layer_norm_param_finish<T><<<grid_for(d), kBlock, 0, stream>>>(
        d, chunks, part_w, part_b, static_cast<T*>(grad_w), static_cast<T*>(grad_b));
    return cudaGetLastError();
  });
}

namespace {

cudaError_t launch_batch_norm_eval_affine(ScalarType dtype, int64_t n, int64_t c, int64_t inner,
                                          const void* in, const void* w, const void* b,
                                          const void* mean, const void* invstd, void* out,
                                          cudaStream_t stream) {
  const int64_t total = n * c * inner;
  if (total == 0) return cudaSuccess;
  return dispatch_f32_f64(dtype, [&](auto tag) {
    using T = decltype(tag);
    batch_norm_eval_affine_kernel<T><<<grid_for(total), kBlock, 0, stream>>>(
        total, c, inner, static_cast<const T*>(in), static_cast<const T*>(w),
        static_cast<const T*>(b), static_cast<const T*>(mean), static_cast<const T*>(invstd),
        static_cast<T*>(out));
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t batch_norm_eval_forward(ScalarType dtype, int64_t n, int64_t c, int64_t inner,
                                    const void* x, const void* w, const void* b, const void* mean,
                                    const void* invstd, void* y, cudaStream_t stream) {
  return launch_batch_norm_eval_affine(dtype, n, c, inner, x, w, b, mean, invstd, y, stream);
}

cudaError_t batch_norm_eval_backward_input(ScalarType dtype, int64_t n, int64_t c, int64_t inner,
                                           const void* grad_y, const void* w, const void* invstd,
                                           void* grad_x, cudaStream_t stream) {
  return launch_batch_norm_eval_affine(dtype, n, c, inner, grad_y, w, nullptr, nullptr, invstd,
                                       grad_x, stream);
}

cudaError_t batch_norm_eval_backward_params(ScalarType dtype, int64_t n, int64_t c,
                                            int64_t inner, const void* grad_y, const void* x,
                                            const void* mean, const void* invstd, void* grad_w,
                                            void* grad_b, cudaStream_t stream) {
  if (c == 0 || (grad_w == nullptr && grad_b == nullptr)) return cudaSuccess;
  return dispatch_f32_f64(dtype, [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = static_cast<unsigned>(c < 65535 ? c : 65535);
    batch_norm_eval_params_kernel<T><<<grid, kBlock, 0, stream>>>(
        n, c, inner, static_cast<const T*>(grad_y), static_cast<const T*>(x),
        static_cast<const T*>(mean), static_cast<const T*>(invstd), static_cast<T*>(grad_w),
        static_cast<T*>(grad_b));
    return cudaGetLastError();
  });
}

cudaError_t channel_stats(ScalarType dtype, int64_t n, int64_t c, int64_t inner, const void* x,
                          double* mean, double* var, double* count, void* workspace,
                          cudaStream_t stream) {
  const int64_t chunks = channel_reduce_chunks(n, c, inner);
  return dispatch_f32_f64(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (chunks > 0) {
      const cudaError_t e = launch_channel_partials(n, c, inner, chunks,
                                                    StatsAcc<T>{static_cast<const T*>(x)},
                                                    workspace, stream);
      if (e != cudaSuccess) return e;
    }
    channel_stats_finish<<<grid_for(c), kBlock, 0, stream>>>(
        c, chunks, static_cast<const Welford<double>*>(workspace), mean, var, count,
        static_cast<double>(n * inner));
    return cudaGetLastError();
  });
}

cudaError_t sync_batch_norm_combine(ScalarType dtype, int world, int64_t c,
                                    const double* gathered, double eps, double momentum,
                                    const void* w, const void* b, void* running_mean,
                                    void* running_var, double* stats, void* scale, void* shift,
                                    cudaStream_t stream) {
  return dispatch_f32_f64(dtype, [&](auto tag) {
    using T = decltype(tag);
    sync_batch_norm_combine_kernel<T><<<grid_for(c), kBlock, 0, stream>>>(
        world, c, gathered, eps, momentum, static_cast<const T*>(w), static_cast<const T*>(b),
        static_cast<T*>(running_mean), static_cast<T*>(running_var), stats,
        static_cast<T*>(scale), static_cast<T*>(shift));
    return cudaGetLastError();
  });
}

cudaError_t channel_affine(ScalarType dtype, int64_t n, int64_t c, int64_t inner, const void* x,
                           const void* scale, const void* shift, void* y, cudaStream_t stream) {
  return dispatch_f32_f64(dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_channel_map(n, c, inner,
                              AffineFn<T>{static_cast<const T*>(x), static_cast<const T*>(scale),
                                          static_cast<const T*>(shift), static_cast<T*>(y)},
                              stream);
  });
}

cudaError_t channel_grad_sums(ScalarType dtype, int64_t n, int64_t c, int64_t inner,
                              const void* gy, const void* x, const double* mean,
                              const double* invstd, double* sum_gy, double* sum_gy_xc,
                              void* grad_w, void* grad_b, void* workspace, cudaStream_t stream) {
  if (c == 0) return cudaSuccess;
  const int64_t chunks = channel_reduce_chunks(n, c, inner);
  return dispatch_f32_f64(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (chunks > 0) {
      const cudaError_t e = launch_channel_partials(
          n, c, inner, chunks,
          GradSumsAcc<T>{static_cast<const T*>(gy), static_cast<const T*>(x), mean}, workspace,
          stream);
      if (e != cudaSuccess) return e;
    }
    channel_grad_sums_finish<T><<<grid_for(c), kBlock, 0, stream>>>(
        c, chunks, static_cast<const Pair<double>*>(workspace), invstd, sum_gy, sum_gy_xc,
        static_cast<T*>(grad_w), static_cast<T*>(grad_b));
    return cudaGetLastError();
  });
}

cudaError_t sync_batch_norm_coefficients(ScalarType dtype, int64_t c, const double* sums,
                                         const double* stats, const void* w, void* coef,
                                         cudaStream_t stream) {
  if (c == 0) return cudaSuccess;
  return dispatch_f32_f64(dtype, [&](auto tag) {
    using T = decltype(tag);
    sync_batch_norm_coefficients_kernel<T><<<grid_for(c), kBlock, 0, stream>>>(
        c, sums, stats, static_cast<const T*>(w), static_cast<T*>(coef));
    return cudaGetLastError();
  });
}

cudaError_t channel_grad_input(ScalarType dtype, int64_t n, int64_t c, int64_t inner,
                               const void* gy, const void* x, const void* coef, void* gx,
                               cudaStream_t stream) {
  return dispatch_f32_f64(dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_channel_map(n, c, inner,
                              GradInputFn<T>{static_cast<const T*>(gy), static_cast<const T*>(x),
                                             static_cast<const T*>(coef), c,
                                             static_cast<T*>(gx)},
                              stream);
  });
}

}  // namespace lockstep::runtime::cuda::kernels
