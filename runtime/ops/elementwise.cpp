// Elementwise kernels with broadcasting, and their autograd.
#include "lockstep/runtime/ops/elementwise.h"

#include <cmath>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/detail/float_map.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/ops/detail/strided_loop.h"

namespace lockstep::runtime {

namespace detail {

Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape st(shape.size(), 0);
  const size_t lead = shape.size() - t.shape().size();
  for (size_t i = 0; i < t.shape().size(); ++i)
    st[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return st;
}

}  // namespace detail

namespace {

// out[i] = f(a[i], b[i]) over the broadcast shape; a and b of type T.
template <class T, class R, class F>
Tensor binary_loop(const Tensor& a, const Tensor& b, DType out_dtype, F f) {
  Shape shape = broadcast_shapes(a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, out_dtype);
  R* o = out.data_ptr<R>();
  const T* pa = static_cast<const T*>(a.storage()->data()) + a.storage_offset();
  const T* pb = static_cast<const T*>(b.storage()->data()) + b.storage_offset();
  detail::strided_loop<3>(
      shape, {out.strides(), detail::broadcast_strides(a, shape), detail::broadcast_strides(b, shape)},
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        R* op = o + off[0];
        const T* ap = pa + off[1];
        const T* bp = pb + off[2];
        if (st[1] == 1 && st[2] == 1) {
          for (int64_t i = 0; i < n; ++i) op[i] = f(ap[i], bp[i]);
        } else if (st[1] == 1 && st[2] == 0) {
          const T y = *bp;
          for (int64_t i = 0; i < n; ++i) op[i] = f(ap[i], y);
        } else if (st[1] == 0 && st[2] == 1) {
          const T x = *ap;
          for (int64_t i = 0; i < n; ++i) op[i] = f(x, bp[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) op[i] = f(ap[i * st[1]], bp[i * st[2]]);
        }
      });
  return out;
}

// The device of a binary op's kernel: a's, or b's when only b is off the CPU
// (the backend then says whether it takes the pair).
Device kernel_device(const Tensor& a, const Tensor& b) {
  return a.device().is_cpu() ? b.device() : a.device();
}

// Arithmetic binary op in the promoted dtype, without autograd.
template <class F>
Tensor arith(const Tensor& a, const Tensor& b, const char* name, F f, BinaryOp op,
             double alpha = 1.0) {
  DType dt = result_type(a, b);
  if (dt == DType::boolean || dt == DType::u8) dt = DType::i64;
  if (const Device d = kernel_device(a, b); !d.is_cpu())
    return device_backend(d).binary(op, a, b, dt, alpha, name);
  Tensor ca = a.to(dt), cb = b.to(dt);
  return dispatch_compute(dt, name, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    return binary_loop<T, T>(ca, cb, dt, [&](T x, T y) {
      return static_cast<T>(f(static_cast<C>(x), static_cast<C>(y)));
    });
  });
}

template <class F>
Tensor compare(const Tensor& a, const Tensor& b, const char* name, F f, BinaryOp op) {
  DType dt = result_type(a, b);
  if (dt == DType::boolean || dt == DType::u8) dt = DType::i64;
  if (const Device d = kernel_device(a, b); !d.is_cpu())
    return device_backend(d).binary(op, a, b, dt, 1.0, name);
  Tensor ca = a.to(dt), cb = b.to(dt);
  return dispatch_compute(dt, name, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    return binary_loop<T, bool>(ca, cb, DType::boolean, [&](T x, T y) {
      return f(static_cast<C>(x), static_cast<C>(y));
    });
  });
}

// f(x) over floating `a` (bf16 and f16 compute in float on the CPU).
template <class F>
Tensor unary(const Tensor& a, const char* name, F f, UnaryOp op, double scalar = 0.0) {
  if (!a.device().is_cpu()) return device_backend(a.device()).unary(op, a, scalar, name);
  return detail::map_float(a, name, f);
}

// The dtype a tensor-scalar op computes and returns in; the scalar is made in
// it. A floating tensor keeps its dtype. An integer or bool tensor stays
// integral for a whole, finite scalar (a double cannot tell 2 from 2.0), in
// i64 for bool and u8 as their tensor-tensor arithmetic is, and becomes f32
// otherwise. Made in the tensor's own dtype instead, the scalar wrapped or
// collapsed first: u8 - 1 added 255, bool * -1e9 gave back the mask.
DType scalar_op_dtype(DType a, double s, const char* name) {
  if (is_floating(a)) return a;
  if (!std::isfinite(s) || std::trunc(s) != s) return DType::f32;
  const DType integral = a == DType::i32 ? DType::i32 : DType::i64;
  LOCKSTEP_CHECK(holds_value(integral, s),
                 "{}: the scalar {} is out of range for the {} tensor's integer arithmetic; "
                 "convert the tensor with .to() first",
                 name, s, dtype_name(a));
  return integral;
}

// The gradient for `input` from a gradient of the broadcast output.
Tensor reduce_grad(const Tensor& g, const Shape& shape, DType dtype) {
  return sum_to(g, shape).to(dtype);
}
Tensor reduce_grad(const Tensor& g, const Tensor& input) {
  return reduce_grad(g, input.shape(), input.dtype());
}

// bool < integers < floating: the kinds result_type compares a 0-d operand by.
int dtype_kind(DType d) {
  if (d == DType::boolean) return 0;
  return is_floating(d) ? 2 : 1;
}

}  // namespace

DType result_type(const Tensor& a, const Tensor& b) {
  if ((a.dim() == 0) == (b.dim() == 0)) return promote_types(a.dtype(), b.dtype());
  const DType dimensioned = a.dim() == 0 ? b.dtype() : a.dtype();
  const DType zero_dim = a.dim() == 0 ? a.dtype() : b.dtype();
  return dtype_kind(zero_dim) <= dtype_kind(dimensioned) ? dimensioned
                                                         : promote_types(a.dtype(), b.dtype());
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    LOCKSTEP_CHECK(x == y || x == 1 || y == 1, "shapes {} and {} do not broadcast (dim {}: {} vs {})",
                   shape_str(a), shape_str(b), i, x, y);
    out[i] = x == 1 ? y : x;
  }
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const size_t lead = g.shape().size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < g.shape().size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  Tensor s = dims.empty() ? g : sum(g, dims, /*keepdim=*/true);
  return s.reshape(shape);
}

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  LOCKSTEP_CHECK(is_floating(result_type(a, b)) ||
                     (std::isfinite(alpha) && std::trunc(alpha) == alpha),
                 "add: alpha {} is not a whole number, so the {} result cannot hold a + alpha*b "
                 "without truncating it; convert an operand to a floating dtype first",
                 alpha, dtype_name(result_type(a, b)));
  // Converted to the integer arithmetic's type (i64 for u8 and bool), an
  // alpha past its range is undefined (1e30 gave INT64_MIN).
  const DType integral = result_type(a, b) == DType::i32 ? DType::i32
                                                                           : DType::i64;
  LOCKSTEP_CHECK(is_floating(result_type(a, b)) ||
                     holds_value(integral, alpha),
                 "add: alpha {} is out of range for the {} arithmetic of an integer result; "
                 "convert an operand to a floating dtype first",
                 alpha, dtype_name(integral));
  Tensor out = alpha == 1.0 ? arith(a, b, "add", [](auto x, auto y) { return x + y; }, BinaryOp::add)
                            : arith(
                                  a, b, "add",
                                  [alpha](auto x, auto y) {
                                    using T = decltype(x);
                                    return x + static_cast<T>(alpha) * y;
                                  },
                                  BinaryOp::add, alpha);
  return record(out, "AddBackward", {a, b}, {},
                [as = a.shape(), ad = a.dtype(), bs = b.shape(), bd = b.dtype(),
                 alpha](const BackwardArgs& g) {
                  Tensor gb = alpha == 1.0 ? g.grad : mul(g.grad, alpha);
                  return std::vector<Tensor>{g.needs[0] ? reduce_grad(g.grad, as, ad) : Tensor(),
                                             g.needs[1] ? reduce_grad(gb, bs, bd) : Tensor()};
                });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = arith(a, b, "sub", [](auto x, auto y) { return x - y; }, BinaryOp::sub);
  return record(out, "SubBackward", {a, b}, {},
                [as = a.shape(), ad = a.dtype(), bs = b.shape(), bd = b.dtype()](const BackwardArgs& g) {
                  return std::vector<Tensor>{g.needs[0] ? reduce_grad(g.grad, as, ad) : Tensor(),
                                             g.needs[1] ? reduce_grad(neg(g.grad), bs, bd) : Tensor()};
                });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = arith(a, b, "mul", [](auto x, auto y) { return x * y; }, BinaryOp::mul);
  return record(out, "MulBackward", {a, b}, {a, b}, [](const BackwardArgs& g) {
    const Tensor &a = g.saved[0], &b = g.saved[1];
    return std::vector<Tensor>{g.needs[0] ? reduce_grad(mul(g.grad, b), a) : Tensor(),
                               g.needs[1] ? reduce_grad(mul(g.grad, a), b) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  DType dt = result_type(a, b);
  LOCKSTEP_CHECK(is_floating(dt), "div: integer division is not supported; convert to f32 first");
  Tensor out = arith(a, b, "div", [](auto x, auto y) { return x / y; }, BinaryOp::div);
  return record(out, "DivBackward", {a, b}, {a, b}, [](const BackwardArgs& g) {
    const Tensor &a = g.saved[0], &b = g.saved[1];
    Tensor ga, gb;
    if (g.needs[0]) ga = reduce_grad(div(g.grad, b), a);
    // -g * ((a / b) / b), as PyTorch: b * b overflows 16-bit floats from
    // |b| > 256 (a zero gradient) and underflows for a small b (0 / 0).
    if (g.needs[1]) gb = reduce_grad(neg(mul(g.grad, div(div(a, b), b))), b);
    return std::vector<Tensor>{ga, gb};
  });
}

Tensor add(const Tensor& a, double s) {
  const DType dt = scalar_op_dtype(a.dtype(), s, "add");
  // bf16 and f16 on the CPU take the scalar in float, not rounded to 16 bits.
  Tensor out = a.device().is_cuda()
                   ? unary(a.to(dt), "add", [](auto x) { return x; }, UnaryOp::add_scalar, s)
               : is_reduced_float(dt)
                   ? unary(a, "add", [s](auto x) { return x + static_cast<decltype(x)>(s); },
                           UnaryOp::add_scalar, s)
                   : arith(a.to(dt), Tensor::scalar(s, dt), "add",
                           [](auto x, auto y) { return x + y; }, BinaryOp::add);
  return record(out, "AddScalarBackward", {a}, {},
                [](const BackwardArgs& g) { return std::vector<Tensor>{g.grad}; });
}

Tensor mul(const Tensor& a, double s) {
  const DType dt = scalar_op_dtype(a.dtype(), s, "mul");
  Tensor out = !a.device().is_cpu()
                   ? unary(a.to(dt), "mul", [](auto x) { return x; }, UnaryOp::mul_scalar, s)
               : is_reduced_float(dt)
                   ? unary(a, "mul", [s](auto x) { return x * static_cast<decltype(x)>(s); },
                           UnaryOp::mul_scalar, s)
                   : arith(a.to(dt), Tensor::scalar(s, dt), "mul",
                           [](auto x, auto y) { return x * y; }, BinaryOp::mul);
  return record(out, "MulScalarBackward", {a}, {},
                [s](const BackwardArgs& g) { return std::vector<Tensor>{mul(g.grad, s)}; });
}

Tensor neg(const Tensor& a) {
  LOCKSTEP_CHECK(a.dtype() != DType::boolean,
                 "neg: negating a bool tensor is not defined; to invert a mask use "
                 "eq(mask, Tensor::scalar(0, DType::boolean))");
  // -1 in a u8 would wrap to 255; u8 arithmetic runs in i64 anyway (arith).
  const DType minus_one = a.dtype() == DType::u8 ? DType::i64 : a.dtype();
  Tensor out = a.device().is_cuda()
                   ? unary(a, "neg", [](auto x) { return -x; }, UnaryOp::neg)
                   : arith(a, Tensor::scalar(-1.0, minus_one), "neg",
                           [](auto x, auto y) { return x * y; }, BinaryOp::mul);
  return record(out, "NegBackward", {a}, {},
                [](const BackwardArgs& g) { return std::vector<Tensor>{neg(g.grad)}; });
}

// exp, log and pow run in f32 under autocast, as in torch.autocast's list:
// an f16 exp overflows from 11.1, an f16 pow(x, 2) from 256.
Tensor exp(const Tensor& a) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {a})) return exp((*c)[0]);
  Tensor out = unary(a, "exp", [](auto x) { return std::exp(x); }, UnaryOp::exp);
  return record(out, "ExpBackward", {a}, {out},
                [](const BackwardArgs& g) { return std::vector<Tensor>{mul(g.grad, g.saved[0])}; });
}

Tensor log(const Tensor& a) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {a})) return log((*c)[0]);
  Tensor out = unary(a, "log", [](auto x) { return std::log(x); }, UnaryOp::log);
  return record(out, "LogBackward", {a}, {a},
                [](const BackwardArgs& g) { return std::vector<Tensor>{div(g.grad, g.saved[0])}; });
}

Tensor sqrt(const Tensor& a) {
  Tensor out = unary(a, "sqrt", [](auto x) { return std::sqrt(x); }, UnaryOp::sqrt);
  return record(out, "SqrtBackward", {a}, {out}, [](const BackwardArgs& g) {
    return std::vector<Tensor>{div(mul(g.grad, 0.5), g.saved[0])};
  });
}

Tensor pow(const Tensor& a, double e) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {a})) return pow((*c)[0], e);
  Tensor out = unary(
      a, "pow",
      [e](auto x) {
        using T = decltype(x);
        return e == 2.0 ? x * x : static_cast<T>(std::pow(x, static_cast<T>(e)));
      },
      UnaryOp::pow_scalar, e);
  return record(out, "PowBackward", {a}, {a}, [e](const BackwardArgs& g) {
    // x^0 is constant; e * x^-1 would give 0 * inf = NaN at x = 0.
    if (e == 0.0)
      return std::vector<Tensor>{
          Tensor::zeros(g.saved[0].shape(), g.saved[0].dtype(), g.saved[0].device())};
    return std::vector<Tensor>{mul(mul(g.grad, pow(g.saved[0], e - 1.0)), e)};
  });
}

Tensor abs(const Tensor& a) {
  Tensor out = unary(a, "abs", [](auto x) { return std::abs(x); }, UnaryOp::abs);
  return record(out, "AbsBackward", {a}, {a}, [](const BackwardArgs& g) {
    Tensor sign = unary(
        g.saved[0], "abs",
        [](auto x) {
          using T = decltype(x);
          return static_cast<T>((x > 0) - (x < 0));
        },
        UnaryOp::sign);
    return std::vector<Tensor>{mul(g.grad, sign)};
  });
}

Tensor eq(const Tensor& a, const Tensor& b) {
  return compare(a, b, "eq", [](auto x, auto y) { return x == y; }, BinaryOp::eq);
}

Tensor gt(const Tensor& a, const Tensor& b) {
  return compare(a, b, "gt", [](auto x, auto y) { return x > y; }, BinaryOp::gt);
}

}  // namespace lockstep::runtime
