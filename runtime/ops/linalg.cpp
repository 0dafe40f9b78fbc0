// matmul and linear: checks and autograd wiring for every device; the
// products on OpenBLAS gemm (CPU) or the device backend's (device_backend.h).
#include "lockstep/runtime/ops/linalg.h"

#include <cblas.h>

#include <limits>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/cpu/openblas_core.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/detail/gemm.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/reduce.h"

namespace lockstep::runtime {

namespace {

// Before main(), while the process has one thread: every program that
// multiplies matrices links this file, so OpenBLAS's kernels are right before
// its first gemm (cpu/openblas_core.h).
[[maybe_unused]] const bool blas_core_repaired = (cpu::repair_blas_core(), true);

}  // namespace

namespace detail {

namespace {

// How BLAS should read a 2-D view: transposed or not, and its leading dim.
struct BlasView {
  Tensor t;  // the view, or a contiguous copy when neither layout fits
  CBLAS_TRANSPOSE trans;
  int64_t ld;
};

BlasView blas_view(const Tensor& x) {
  const int64_t r = x.shape()[0], c = x.shape()[1];
  const int64_t s0 = x.strides()[0], s1 = x.strides()[1];
  if ((s1 == 1 || c == 1) && (s0 >= std::max<int64_t>(c, 1) || r == 1))
    return {x, CblasNoTrans, r == 1 ? std::max<int64_t>(c, 1) : s0};
  if ((s0 == 1 || r == 1) && (s1 >= std::max<int64_t>(r, 1) || c == 1))
    return {x, CblasTrans, c == 1 ? std::max<int64_t>(r, 1) : s1};
  Tensor cx = x.contiguous();
  return {cx, CblasNoTrans, std::max<int64_t>(c, 1)};
}

// OpenBLAS's sizes are 32-bit (blasint): a larger one would wrap into a
// wrong product or a write out of bounds, so it is refused.
blasint blas_size(int64_t v, const char* what) {
  constexpr int64_t kMax = std::numeric_limits<blasint>::max();
  LOCKSTEP_CHECK(v >= 0 && v <= kMax,
                 "matmul on the CPU: {} = {} does not fit OpenBLAS's 32-bit sizes (at most {}); "
                 "split the product into smaller ones",
                 what, v, kMax);
  return static_cast<blasint>(v);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, blas_size(m, "m"), blas_size(n, "n"),
              blas_size(k, "k"), alpha, a, blas_size(lda, "lda"), b, blas_size(ldb, "ldb"), beta,
              c, blas_size(ldc, "ldc"));
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, blas_size(m, "m"), blas_size(n, "n"),
              blas_size(k, "k"), alpha, a, blas_size(lda, "lda"), b, blas_size(ldb, "ldb"), beta,
              c, blas_size(ldc, "ldc"));
}

void gemm(const Tensor& a, const Tensor& b, Tensor& c, double alpha, double beta) {
  if (!a.device().is_cpu()) return device_backend(a.device()).gemm(a, b, c, alpha, beta);
  LOCKSTEP_CHECK(b.device().is_cpu() && c.device().is_cpu(),
                 "matmul: operands are on different devices ({}, {} and {}); move them to one "
                 "with .to(device)",
                 a.device().str(), b.device().str(), c.device().str());
  LOCKSTEP_ASSERT(a.dim() == 2 && b.dim() == 2 && c.dim() == 2);
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  LOCKSTEP_ASSERT(b.shape()[0] == k && c.shape()[0] == m && c.shape()[1] == n);
  LOCKSTEP_ASSERT(c.strides()[1] == 1 || n <= 1);
  LOCKSTEP_CHECK(a.dtype() == b.dtype() && a.dtype() == c.dtype(),
                 "matmul: dtypes differ ({} and {}); convert one with .to()", dtype_name(a.dtype()),
                 dtype_name(b.dtype()));
  if (m == 0 || n == 0) return;
  const int64_t ldc = m == 1 ? std::max<int64_t>(n, 1) : c.strides()[0];
  if (k == 0) {
    if (beta == 0.0) c.zero_();
    else c.mul_(beta);
    return;
  }
  if (is_reduced_float(a.dtype())) {
    // OpenBLAS as Debian builds it has no 16-bit gemm: widen the operands
    // (exactly), multiply and accumulate in f32, round once into c.
    NoGradGuard no_grad;
    Tensor c32 = beta == 0.0 ? Tensor::empty(c.shape(), DType::f32) : c.to(DType::f32);
    gemm(a.to(DType::f32), b.to(DType::f32), c32, alpha, beta);
    c.copy_(c32);
    return;
  }
  BlasView va = blas_view(a), vb = blas_view(b);
  const bool ta = va.trans == CblasTrans, tb = vb.trans == CblasTrans;
  dispatch_float(a.dtype(), "matmul", [&](auto tag) {
    using T = decltype(tag);
    gemm(ta, tb, m, n, k, static_cast<T>(alpha), va.t.data_ptr<T>(), va.ld, vb.t.data_ptr<T>(),
         vb.ld, static_cast<T>(beta), c.data_ptr<T>(), ldc);
  });
  c.storage()->bump_version();
}

}  // namespace detail

namespace {

Tensor mm(const Tensor& a, const Tensor& b) {
  Tensor c = Tensor::empty({a.shape()[0], b.shape()[1]}, a.dtype(), a.device());
  detail::gemm(a, b, c);
  return c;
}

// out[i] = a[i] @ b[i] over the leading dim of 3-D operands.
void bmm(const Tensor& a, const Tensor& b, Tensor& out) {
  if (!a.device().is_cpu()) return device_backend(a.device()).gemm_batched(a, b, out);
  for (int64_t i = 0; i < a.shape()[0]; ++i) {
    Tensor c = out.select(0, i);
    detail::gemm(a.select(0, i), b.select(0, i), c);
  }
}

// Sum over the rows of a 2-D gradient: the bias gradient of linear.
Tensor sum_rows(const Tensor& g2) {
  if (!g2.device().is_cpu()) return device_backend(g2.device()).sum_rows(g2);
  return sum(g2, {0});
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b, const Tensor& c = {}) {
  LOCKSTEP_CHECK(a.device() == b.device() && (!c.defined() || c.device() == a.device()),
                 "{}: operands are on different devices ({} and {}); move them to one with "
                 ".to(device)",
                 op, a.device().str(), (a.device() == b.device() ? c : b).device().str());
}

// [.., k] as [rows, k]. The row count is spelled out: reshape's -1 cannot be
// inferred when k is 0.
Tensor as_rows(const Tensor& t) {
  int64_t rows = 1;
  for (int64_t i = 0; i + 1 < t.dim(); ++i) rows *= t.shape()[i];
  return t.reshape({rows, t.shape().back()});
}

// torch.matmul's rules for what the two direct paths below do not take: a
// 1-D a is read as [1, k] and a 1-D b as [k, 1], that added dim dropped from
// the result; the batch dims (all but a matrix's last two) broadcast against
// each other, and every batch of the broadcast shape is one [m, k] x [k, n]
// product. The operands are expanded to the broadcast batch and folded into
// one batch dim for bmm: the fold is a view where the strides allow it (equal
// batch dims, or broadcast ones that keep a zero stride), a copy only where
// an operand's dims do not merge. Backward folds the
// gradient the same way and sums each operand's gradient back to its shape.
struct BatchedProduct {
  Shape a_mat, b_mat;  // the operands as matrices: a 1-D one with its 1 added
  Shape batch;         // the broadcast batch dims
  int64_t count = 1;   // their product: bmm's batch
  Shape out_shape;     // batch + [m] + [n], without the dims added for 1-D operands

  BatchedProduct(const Tensor& a, const Tensor& b) {
    a_mat = a.dim() == 1 ? Shape{1, a.shape()[0]} : a.shape();
    b_mat = b.dim() == 1 ? Shape{b.shape()[0], 1} : b.shape();
    const size_t na = a_mat.size() - 2, nb = b_mat.size() - 2, n = std::max(na, nb);
    batch.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t x = i < n - na ? 1 : a_mat[i - (n - na)];
      const int64_t y = i < n - nb ? 1 : b_mat[i - (n - nb)];
      LOCKSTEP_CHECK(x == y || x == 1 || y == 1,
                     "matmul: the batch dims of {} and {} do not broadcast (batch dim {}: {} vs "
                     "{}); each batch dim must be equal or 1 in one of them",
                     shape_str(a.shape()), shape_str(b.shape()), i, x, y);
      batch[i] = x == 1 ? y : x;
      count *= batch[i];
    }
    out_shape = batch;
    if (a.dim() > 1) out_shape.push_back(a_mat[a_mat.size() - 2]);
    if (b.dim() > 1) out_shape.push_back(b_mat.back());
  }

  // t (a or b) as [count, rows, cols], its matrix shape `mat`.
  Tensor fold(const Tensor& t, const Shape& mat) const {
    const int64_t rows = mat[mat.size() - 2], cols = mat.back();
    Shape full = batch;
    full.push_back(rows);
    full.push_back(cols);
    return t.view(mat).expand(full).reshape({count, rows, cols});
  }
  // A [count, rows, cols] gradient summed back to the operand's shape.
  Tensor unfold(const Tensor& g3, const Shape& mat, const Shape& shape) const {
    Shape full = batch;
    full.push_back(g3.shape()[1]);
    full.push_back(g3.shape()[2]);
    return sum_to(g3.view(full), mat).reshape(shape);
  }
};

Tensor batched_matmul(const Tensor& a, const Tensor& b) {
  const BatchedProduct p(a, b);
  Tensor out;
  {
    NoGradGuard no_grad;  // the folds stay out of the graph: MatmulBackward covers them
    Tensor a3 = p.fold(a, p.a_mat), b3 = p.fold(b, p.b_mat);
    out = Tensor::empty({p.count, a3.shape()[1], b3.shape()[2]}, a.dtype(), a.device());
    bmm(a3, b3, out);
  }
  return record(out.view(p.out_shape), "MatmulBackward", {a, b}, {a, b},
                [p](const BackwardArgs& g) {
                  const Tensor &a = g.saved[0], &b = g.saved[1];
                  const Tensor g3 = g.grad.reshape({p.count, p.a_mat[p.a_mat.size() - 2],
                                                    p.b_mat.back()});
                  Tensor ga, gb;
                  if (g.needs[0])
                    ga = p.unfold(matmul(g3, p.fold(b, p.b_mat).transpose(1, 2)), p.a_mat,
                                  a.shape());
                  if (g.needs[1])
                    gb = p.unfold(matmul(p.fold(a, p.a_mat).transpose(1, 2), g3), p.b_mat,
                                  b.shape());
                  return std::vector<Tensor>{ga, gb};
                });
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::lower, {a, b}))
    return matmul((*c)[0], (*c)[1]);
  check_same_device("matmul", a, b);
  LOCKSTEP_CHECK(a.dim() >= 1 && b.dim() >= 1,
                 "matmul: both operands need at least 1 dim, got {} x {}; multiply by a 0-d "
                 "tensor with mul()",
                 shape_str(a.shape()), shape_str(b.shape()));
  const int64_t kb = b.dim() == 1 ? b.shape()[0] : b.shape()[b.dim() - 2];
  LOCKSTEP_CHECK(a.shape().back() == kb, "matmul: inner dimensions differ: {} x {} ({} vs {})",
                 shape_str(a.shape()), shape_str(b.shape()), a.shape().back(), kb);
  // A matrix times a vector is [.., m, k] x [k, 1]: the first direct path, one gemm.
  if (a.dim() >= 2 && b.dim() == 1) return matmul(a, b.unsqueeze(1)).squeeze(-1);
  const bool rows_by_matrix = a.dim() >= 2 && b.dim() == 2;
  const bool same_batch = a.dim() == 3 && b.dim() == 3 && a.shape()[0] == b.shape()[0];
  if (!rows_by_matrix && !same_batch) return batched_matmul(a, b);
  Tensor out;
  if (rows_by_matrix) {
    Shape out_shape = a.shape();
    out_shape.back() = b.shape()[1];
    Tensor a2 = a.dim() == 2 ? a : as_rows(a);
    out = mm(a2, b).reshape(out_shape);
  } else {
    out = Tensor::empty({a.shape()[0], a.shape()[1], b.shape()[2]}, a.dtype(), a.device());
    bmm(a, b, out);
  }
  return record(out, "MatmulBackward", {a, b}, {a, b}, [](const BackwardArgs& g) {
    const Tensor &a = g.saved[0], &b = g.saved[1];
    Tensor ga, gb;
    if (b.dim() == 2) {
      Tensor g2 = as_rows(g.grad);
      if (g.needs[0]) ga = mm(g2, b.t()).reshape(a.shape());
      if (g.needs[1]) gb = mm(as_rows(a).t(), g2);
    } else {
      if (g.needs[0]) ga = matmul(g.grad, b.transpose(1, 2));
      if (g.needs[1]) gb = matmul(a.transpose(1, 2), g.grad);
    }
    return std::vector<Tensor>{ga, gb};
  });
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::lower, {x, weight, bias}))
    return linear((*c)[0], (*c)[1], (*c)[2]);
  LOCKSTEP_CHECK(weight.dim() == 2, "linear: weight must be [out, in], got {}",
                 shape_str(weight.shape()));
  LOCKSTEP_CHECK(x.dim() >= 1 && x.shape().back() == weight.shape()[1],
                 "linear: input {} has {} features but the weight {} expects {}",
                 shape_str(x.shape()), x.dim() ? x.shape().back() : 0, shape_str(weight.shape()),
                 weight.shape()[1]);
  LOCKSTEP_CHECK(!bias.defined() || (bias.dim() == 1 && bias.shape()[0] == weight.shape()[0]),
                 "linear: bias must be [{}], got {}", weight.shape()[0], shape_str(bias.shape()));
  check_same_device("linear", x, weight, bias);
  const int64_t out_f = weight.shape()[0];
  Tensor x2 = as_rows(x);
  Tensor out = Tensor::empty({x2.shape()[0], out_f}, x.dtype(), x.device());
  if (bias.defined()) out.copy_(bias.detach());  // broadcast rows, then gemm adds onto them
  detail::gemm(x2, weight.t(), out, 1.0, bias.defined() ? 1.0 : 0.0);
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  out = out.view(out_shape);
  return record(out, "LinearBackward", {x, weight, bias}, {x2, weight},
                [x_shape = x.shape()](const BackwardArgs& g) {
                  const Tensor &x2 = g.saved[0], &w = g.saved[1];
                  Tensor g2 = as_rows(g.grad);
                  Tensor gx, gw, gb;
                  if (g.needs[0]) gx = mm(g2, w).view(x_shape);
                  if (g.needs[1]) gw = mm(g2.t(), x2);
                  if (g.needs[2]) gb = sum_rows(g2);
                  return std::vector<Tensor>{gx, gw, gb};
                });
}

}  // namespace lockstep::runtime
