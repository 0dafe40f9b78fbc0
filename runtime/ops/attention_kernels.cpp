// Blocked attention on the CPU (FlashAttention-2, Dao 2023, on one core).
//
// For one head, with S = scale * Q K^T + mask the [l, s] scores, P =
// softmax(S) row-wise, Z the dropout keep mask scaled by 1 / (1 - p), and
// O = (P o Z) V, no more than one tile of S is ever held: queries are taken
// kBlockQ at a time, keys kBlockK at a time.
//
// Forward, per query block, keeps for every row a running maximum m, a
// running denominator l = sum exp(S - m) and an unnormalised output acc.
// Each key block's score tile S_t = scale * Q_i K_j^T (+ mask) updates them:
//
//   m'  = max(m, rowmax(S_t)),  c = exp(m - m')
//   P_t = exp(S_t - m'),  l' = c * l + rowsum(P_t),  acc' = c * acc + (P_t o Z_t) V_j
//
// and at the end O = acc / l; m and 1 / l are kept for backward. Dropout
// multiplies P_t after its row sum entered l: the denominator is that of the
// undropped softmax.
//
// Backward recomputes every tile's weights from them, P_t = exp(S_t - m) / l,
// so nothing of size [l, s] is stored. Not exp(S_t - lse) with one lse =
// m + log(l): where |m| is large (a row masked by a finite -1e9), log(l)
// rounds away in m + log(l), and every weight of such a row would read 1.
// With dO the output gradient and D = rowsum(dO o O) (= rowsum(P o dP),
// which avoids a pass over the keys):
//
//   dV_j += (P_t o Z_t)^T dO_i
//   dP_t  = (dO_i V_j^T) o Z_t
//   dS_t  = P_t o (dP_t - D_i)
//   dQ_i += scale * dS_t K_j,   dK_j += scale * dS_t^T Q_i
//
// Key blocks are the outer loop, so dK_j and dV_j stay in cache while the
// query blocks pass. Every tile product is an OpenBLAS gemm on the tile in
// place (no packing of our own).
//
// Masking: a masked score is -inf, so its weight is exactly 0 in both passes.
// A row with every key masked keeps m = -inf and l = 0: its output is 0, and
// it is stored as m = +inf, which makes its recomputed weights 0 and so its
// gradients 0.
// Causal: the keys of a query block stop at its last query, and backward
// starts each key block at the first query block that can see it; only the
// tiles on the diagonal are masked element by element.
//
// Dropout draws are Philox positions computed from (head, query, key), so
// backward redraws forward's mask tile by tile instead of storing it.
#include "lockstep/runtime/ops/attention_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lockstep/runtime/cpu/simd.h"
#include "lockstep/runtime/cpu/vec_math.h"
#include "lockstep/runtime/ops/detail/gemm.h"
#include "lockstep/runtime/random.h"

namespace lockstep::runtime::attention_kernels {
namespace {

using detail::gemm;

constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;

using cpu::vec_t;

// One tile: queries [i0, i0 + nq) of head b against keys [j0, j0 + nk).
struct Tile {
  int64_t b, i0, nq, j0, nk;
};

template <class T>
constexpr T kInf = std::numeric_limits<T>::infinity();

// s [nq, kBlockK] = the tile's scores: scale * q_i . k_j + bias(i, j), or
// -inf where query i may not attend key j.
template <class T>
void score_tile(const Problem<T>& p, const Tile& t, T* s) {
  const Dims& d = p.dims;
  gemm(false, true, t.nq, t.nk, d.e, p.scale, p.q + (t.b * d.l + t.i0) * d.e, d.e,
       p.k + (t.b * d.s + t.j0) * d.e, d.e, T(0), s, kBlockK);
  const Mask<T>& m = p.mask;
  if (m.keep || m.bias) {
    for (int64_t r = 0; r < t.nq; ++r) {
      const int64_t row = m.at[t.b] + (t.i0 + r) * m.row_stride + t.j0 * m.col_stride;
      T* sr = s + r * kBlockK;
      if (m.keep) {
        for (int64_t c = 0; c < t.nk; ++c)
          if (!m.keep[row + c * m.col_stride]) sr[c] = -kInf<T>;
      } else {
        for (int64_t c = 0; c < t.nk; ++c) sr[c] += m.bias[row + c * m.col_stride];
      }
    }
  }
  if (p.causal && t.j0 + t.nk - 1 > t.i0) {  // the tile crosses the diagonal
    for (int64_t r = 0; r < t.nq; ++r) {
      const int64_t first_masked = std::max<int64_t>(t.i0 + r + 1 - t.j0, 0);
      std::fill(s + r * kBlockK + std::min(first_masked, t.nk), s + r * kBlockK + t.nk,
                -kInf<T>);
    }
  }
}

// z [nq, kBlockK] = the tile's dropout factors: 1 / (1 - p) where kept, 0
// where dropped.
template <class T>
void dropout_tile(const Problem<T>& p, const Tile& t, uint32_t* draws, T* z) {
  const Dims& d = p.dims;
  const Dropout& dr = p.dropout;
  const T kept = static_cast<T>(dr.scale);
  for (int64_t r = 0; r < t.nq; ++r) {
    const uint64_t first =
        dr.base + static_cast<uint64_t>((t.b * d.l + t.i0 + r) * d.s + t.j0);
    philox_u32(dr.seed, first, draws, static_cast<size_t>(t.nk));
    T* zr = z + r * kBlockK;
    for (int64_t c = 0; c < t.nk; ++c) zr[c] = draws[c] < dr.threshold ? kept : T(0);
  }
}

}  // namespace

template <class T>
void forward(const Problem<T>& p, T* out, Rows<T> rows) {
  const Dims& d = p.dims;
  std::vector<T> s(kBlockQ * kBlockK), z(p.dropout.on ? kBlockQ * kBlockK : 0);
  std::vector<T> acc(kBlockQ * d.ev), m(kBlockQ), l(kBlockQ);
  std::vector<uint32_t> draws(kBlockK);
  for (int64_t b = 0; b < d.bh; ++b) {
    for (int64_t i0 = 0; i0 < d.l; i0 += kBlockQ) {
      const int64_t nq = std::min(kBlockQ, d.l - i0);
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(m.begin(), m.end(), -kInf<T>);
      std::fill(l.begin(), l.end(), T(0));
      const int64_t keys = p.causal ? std::min(d.s, i0 + nq) : d.s;
      for (int64_t j0 = 0; j0 < keys; j0 += kBlockK) {
        const Tile t{b, i0, nq, j0, std::min(kBlockK, keys - j0)};
        score_tile(p, t, s.data());
        for (int64_t r = 0; r < nq; ++r) {
          T* sr = s.data() + r * kBlockK;
          const T tile_max = cpu::row_max(sr, t.nk);  // NaN stays NaN, to the output
          const T m_new = tile_max != tile_max ? tile_max : std::max(m[r], tile_max);
          if (m_new == -kInf<T>) {  // every key so far masked: nothing to add
            std::fill(sr, sr + t.nk, T(0));
            continue;
          }
          const T sum = cpu::exp_shifted(sr, sr, t.nk, m_new);
          const T correction = std::exp(m[r] - m_new);
          l[r] = l[r] * correction + sum;
          m[r] = m_new;
          if (correction != T(1)) {
            T* ar = acc.data() + r * d.ev;
            for (int64_t c = 0; c < d.ev; ++c) ar[c] *= correction;
          }
        }
        if (p.dropout.on) {
          dropout_tile(p, t, draws.data(), z.data());
          for (int64_t x = 0; x < nq * kBlockK; ++x) s[x] *= z[x];
        }
        gemm(false, false, nq, d.ev, t.nk, T(1), s.data(), kBlockK,
             p.v + (b * d.s + j0) * d.ev, d.ev, T(1), acc.data(), d.ev);
      }
      for (int64_t r = 0; r < nq; ++r) {
        const int64_t row = b * d.l + i0 + r;
        T* o = out + p.out_at.at(b, i0 + r);
        const T* ar = acc.data() + r * d.ev;
        if (l[r] == T(0)) {
          std::fill(o, o + d.ev, T(0));
          rows.max[row] = kInf<T>;
          rows.inv_sum[row] = T(1);
          continue;
        }
        const T inv = T(1) / l[r];
        for (int64_t c = 0; c < d.ev; ++c) o[c] = ar[c] * inv;
        rows.max[row] = m[r];
        rows.inv_sum[row] = inv;
      }
    }
  }
}

template <class T>
void backward(const Problem<T>& p, const T* out, Rows<const T> rows, const T* grad_out,
              T* grad_q, T* grad_k, T* grad_v) {
  const Dims& d = p.dims;
  const bool want_ds = grad_q || grad_k;
  std::vector<T> pt(kBlockQ * kBlockK), dp(kBlockQ * kBlockK);
  std::vector<T> z(p.dropout.on ? kBlockQ * kBlockK : 0), pz(z.size());
  std::vector<T> delta(d.l);
  std::vector<uint32_t> draws(kBlockK);
  for (int64_t b = 0; b < d.bh; ++b) {
    if (want_ds) {
      for (int64_t i = 0; i < d.l; ++i) {
        const T* go = grad_out + p.out_at.at(b, i);
        const T* o = out + p.out_at.at(b, i);
        T dot = 0;
        for (int64_t c = 0; c < d.ev; ++c) dot += go[c] * o[c];
        delta[i] = dot;
      }
    }
    for (int64_t j0 = 0; j0 < d.s; j0 += kBlockK) {
      const int64_t nk = std::min(kBlockK, d.s - j0);
      // Causal: queries before j0 see none of these keys.
      const int64_t first_block = p.causal ? (j0 / kBlockQ) * kBlockQ : 0;
      for (int64_t i0 = first_block; i0 < d.l; i0 += kBlockQ) {
        const Tile t{b, i0, std::min(kBlockQ, d.l - i0), j0, nk};
        const int64_t first_row = b * d.l + i0;
        score_tile(p, t, pt.data());
        for (int64_t r = 0; r < t.nq; ++r) {
          T* row = pt.data() + r * kBlockK;
          cpu::exp_shifted(row, row, nk, rows.max[first_row + r]);
          const T inv = rows.inv_sum[first_row + r];
          for (int64_t c = 0; c < nk; ++c) row[c] *= inv;
        }
        const T* weights = pt.data();  // P o Z: what forward multiplied V by
        if (p.dropout.on) {
          dropout_tile(p, t, draws.data(), z.data());
          for (int64_t x = 0; x < t.nq * kBlockK; ++x) pz[x] = pt[x] * z[x];
          weights = pz.data();
        }
        const T* go_i = grad_out + p.out_at.at(b, i0);
        const int64_t go_ld = p.out_at.row_stride;
        if (grad_v)
          gemm(true, false, nk, d.ev, t.nq, T(1), weights, kBlockK, go_i, go_ld, T(1),
               grad_v + (b * d.s + j0) * d.ev, d.ev);
        if (!want_ds) continue;
        gemm(false, true, t.nq, nk, d.ev, T(1), go_i, go_ld, p.v + (b * d.s + j0) * d.ev, d.ev,
             T(0), dp.data(), kBlockK);
        for (int64_t r = 0; r < t.nq; ++r) {
          T* dr = dp.data() + r * kBlockK;
          const T* pr = pt.data() + r * kBlockK;
          const T dl = delta[i0 + r];
          if (p.dropout.on) {
            const T* zr = z.data() + r * kBlockK;
            for (int64_t c = 0; c < nk; ++c) dr[c] = pr[c] * (dr[c] * zr[c] - dl);
          } else {
            for (int64_t c = 0; c < nk; ++c) dr[c] = pr[c] * (dr[c] - dl);
          }
        }
        if (grad_q)
          gemm(false, false, t.nq, d.e, nk, p.scale, dp.data(), kBlockK,
               p.k + (b * d.s + j0) * d.e, d.e, T(1), grad_q + (b * d.l + i0) * d.e, d.e);
        if (grad_k)
          gemm(true, false, nk, d.e, t.nq, p.scale, dp.data(), kBlockK,
               p.q + (b * d.l + i0) * d.e, d.e, T(1), grad_k + (b * d.s + j0) * d.e, d.e);
      }
    }
  }
}

template void forward<float>(const Problem<float>&, float*, Rows<float>);
template void forward<double>(const Problem<double>&, double*, Rows<double>);
template void backward<float>(const Problem<float>&, const float*, Rows<const float>,
                              const float*, float*, float*, float*);
template void backward<double>(const Problem<double>&, const double*, Rows<const double>,
                               const double*, double*, double*, double*);

}  // namespace lockstep::runtime::attention_kernels
