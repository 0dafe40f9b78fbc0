// scaled_dot_product_attention: argument checks and the autograd wiring for
// every device, the blocked CPU kernels (attention_kernels.cpp), and the math
// path composed from differentiable ops.
#include "lockstep/runtime/ops/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/ops/activation.h"
#include "lockstep/runtime/ops/attention_kernels.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/linalg.h"
#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/ops/detail/reduced_float.h"

namespace lockstep::runtime {
namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// The sizes of one call: q [lead..., l, e], k [lead..., s, e], v [lead..., s, ev].
struct Geometry {
  Shape lead;
  int64_t bh = 1;  // prod(lead): the heads, all leading dims together
  int64_t l = 0, s = 0, e = 0, ev = 0;

  Shape shape(int64_t rows, int64_t cols) const {
    Shape out = lead;
    out.push_back(rows);
    out.push_back(cols);
    return out;
  }
};

void check_tensor(const Tensor& t, const char* name, const Tensor& q) {
  LOCKSTEP_CHECK(t.defined(), "{}: {} is undefined", kOp, name);
  LOCKSTEP_CHECK(t.dtype() == q.dtype(), "{}: q is {} but {} is {}; give q, k and v one dtype "
                 "(convert with .to())", kOp, dtype_name(q.dtype()), name, dtype_name(t.dtype()));
  LOCKSTEP_CHECK(t.device() == q.device(), "{}: q is on {} but {} is on {}; move it with "
                 ".to(device)", kOp, q.device().str(), name, t.device().str());
}

void check_options(const AttentionOptions& o, const Geometry& g, const Tensor& q);

Geometry check_args(const Tensor& q, const Tensor& k, const Tensor& v,
                    const AttentionOptions& o) {
  LOCKSTEP_CHECK(q.defined(), "{}: q is undefined", kOp);
  check_tensor(k, "k", q);
  check_tensor(v, "v", q);
  LOCKSTEP_CHECK(is_floating(q.dtype()), "{}: q, k and v must be floating, got {}", kOp,
                 dtype_name(q.dtype()));
  LOCKSTEP_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(),
                 "{}: expected q [..., L, E], k [..., S, E] and v [..., S, Ev] with the same "
                 "number of dims (at least 2), got q {}, k {}, v {}",
                 kOp, shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  Geometry g;
  g.lead.assign(q.shape().begin(), q.shape().end() - 2);
  for (const Tensor* t : {&k, &v}) {
    LOCKSTEP_CHECK(Shape(t->shape().begin(), t->shape().end() - 2) == g.lead,
                   "{}: the leading (batch, head) dims differ: q {}, k {}, v {}; they are not "
                   "broadcast, expand them to one shape first",
                   kOp, shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  }
  g.bh = shape_numel(g.lead);
  g.l = q.size(-2), g.s = k.size(-2), g.e = q.size(-1), g.ev = v.size(-1);
  LOCKSTEP_CHECK(k.size(-1) == g.e, "{}: q and k must have the same head dim E (last dim), got "
                 "q {} and k {}", kOp, shape_str(q.shape()), shape_str(k.shape()));
  LOCKSTEP_CHECK(v.size(-2) == g.s, "{}: k and v must have the same number of keys S (dim -2), "
                 "got k {} and v {}", kOp, shape_str(k.shape()), shape_str(v.shape()));
  LOCKSTEP_CHECK(g.e >= 1 && g.ev >= 1, "{}: head dims must be at least 1, got E = {} (q {}) and "
                 "Ev = {} (v {})", kOp, g.e, shape_str(q.shape()), g.ev, shape_str(v.shape()));
  check_options(o, g, q);
  return g;
}

// The options against the call's geometry; `q` gives the dtype and device.
void check_options(const AttentionOptions& o, const Geometry& g, const Tensor& q) {
  LOCKSTEP_CHECK(o.dropout >= 0.0 && o.dropout < 1.0,
                 "{}: dropout = {} must be in [0, 1); pass 0 to turn it off (in eval)", kOp,
                 o.dropout);
  LOCKSTEP_CHECK(!o.scale || std::isfinite(*o.scale), "{}: scale = {} must be finite", kOp,
                 o.scale.value_or(0.0));
  if (o.mask.defined()) {
    const Tensor& m = o.mask;
    LOCKSTEP_CHECK(!o.causal, "{}: causal and mask cannot be combined; put the causal part into "
                   "the mask (true where key j <= query i) and pass causal = false", kOp);
    LOCKSTEP_CHECK(m.dtype() == DType::boolean || m.dtype() == q.dtype(),
                   "{}: the mask must be bool (true = may attend) or additive in q's dtype {}, "
                   "got {}; convert it with .to()", kOp, dtype_name(q.dtype()),
                   dtype_name(m.dtype()));
    LOCKSTEP_CHECK(m.device() == q.device(), "{}: q is on {} but the mask is on {}; move it with "
                   ".to(device)", kOp, q.device().str(), m.device().str());
    // A learned bias (relative positions, ALiBi slopes) would silently never
    // train: refuse rather than drop its gradient.
    LOCKSTEP_CHECK(!m.requires_grad() || !grad_enabled(),
                   "{}: the mask requires grad, but it gets no gradient here; pass "
                   "mask.detach() for a fixed mask, or add a learned bias to the scores with "
                   "scaled_dot_product_attention_math's ops (matmul, add, softmax) instead",
                   kOp);
    const Shape scores = g.shape(g.l, g.s);
    bool fits = m.dim() <= static_cast<int64_t>(scores.size());
    for (int64_t i = 1; fits && i <= m.dim(); ++i)
      fits = m.size(-i) == 1 || m.size(-i) == scores[scores.size() - i];
    LOCKSTEP_CHECK(fits, "{}: a mask of shape {} does not broadcast to the scores [..., L, S] = "
                   "{}; give each dim the scores' size or 1 (e.g. [B, 1, 1, S] to mask padded "
                   "keys)", kOp, shape_str(m.shape()), shape_str(scores));
  }
}

double scale_of(const AttentionOptions& o, const Geometry& g) {
  return o.scale.value_or(1.0 / std::sqrt(static_cast<double>(g.e)));
}

// [lead..., rows, cols] as [bh, rows, cols].
Tensor heads(const Tensor& t, const Geometry& g) {
  return t.reshape({g.bh, t.size(-2), t.size(-1)});
}

// ---- The math path ----

// [l, s] on `device`: 0 where query i may attend key j (j <= i), -inf where not.
Tensor causal_bias(int64_t l, int64_t s, DType dtype, Device device) {
  Tensor keep = Tensor::empty({l, s}, DType::boolean);
  bool* p = keep.data_ptr<bool>();
  for (int64_t i = 0; i < l; ++i)
    for (int64_t j = 0; j < s; ++j) p[i * s + j] = j <= i;
  return log(keep.to(device).to(dtype));
}

}  // namespace

// A row whose keys are all masked would be softmax over -inf only (NaN). The
// math path gives every row one more column, a sentinel score that is 0 in
// such rows and -inf elsewhere: a fully masked row puts all its weight on the
// sentinel (so 0 on every key, and no gradient), any other row none. Built
// from comparisons and log, not a host loop, so it runs on any device.
Tensor scaled_dot_product_attention_math(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const AttentionOptions& options) {
  const Geometry g = check_args(q, k, v, options);
  const DType dtype = q.dtype();
  Tensor scores = matmul(heads(q, g), heads(k, g).transpose(1, 2)) * scale_of(options, g);
  scores = scores.reshape(g.shape(g.l, g.s));
  Tensor weights;
  if (options.causal) {
    weights = softmax(scores + causal_bias(g.l, g.s, dtype, q.device()), -1);
  } else if (options.mask.defined() && g.s > 0) {
    Tensor mask = options.mask.detach();
    while (mask.dim() < 2) mask = mask.unsqueeze(0);
    const bool is_bool = mask.dtype() == DType::boolean;
    const Tensor minus_inf =
        Tensor::full({}, -std::numeric_limits<double>::infinity(), dtype, mask.device());
    const Tensor keep = (is_bool ? mask : gt(mask, minus_inf)).to(dtype);  // 1: may attend
    const Tensor bias = is_bool ? log(keep) : mask;
    const Tensor any_key = max(keep, -1, true);  // [..., L or 1, 1]: 1 unless fully masked
    const Tensor sentinel = log(neg(any_key) + 1.0).expand(g.shape(g.l, 1));
    weights = softmax(cat({scores + bias, sentinel}, -1), -1).slice(-1, 0, g.s);
  } else {
    weights = softmax(scores, -1);
  }
  if (options.dropout > 0.0) {
    Generator& gen = options.generator ? *options.generator : default_generator();
    weights = dropout(weights, options.dropout, true, gen);
  }
  return matmul(heads(weights, g), heads(v, g)).reshape(g.shape(g.l, g.ev));
}

namespace {

// ---- The blocked path ----

// What the CPU kernels need besides the tensors; captured by backward.
struct KernelArgs {
  attention_kernels::Dims dims;
  // Contiguous [bh, l, ev] unless set otherwise (attention_from_qkv).
  attention_kernels::Layout out_at;
  double scale = 1.0;
  bool causal = false;
  attention_kernels::Dropout dropout;
  std::vector<int64_t> mask_at;  // [bh], element offsets into the expanded mask
  int64_t mask_row_stride = 0, mask_col_stride = 0;
};

// The mask broadcast to [lead..., l, s] as a view (stride 0 where it
// repeats), and where each head's [l, s] block of it starts.
Tensor expand_mask(const Tensor& mask, const Geometry& g, KernelArgs& args) {
  if (!mask.defined()) return {};
  const Tensor m = mask.detach().expand(g.shape(g.l, g.s));
  const int64_t nlead = static_cast<int64_t>(g.lead.size());
  args.mask_at.assign(g.bh, 0);
  for (int64_t b = 0; b < g.bh; ++b) {
    int64_t rest = b, at = 0;
    for (int64_t d = nlead - 1; d >= 0; --d) {
      at += (rest % g.lead[d]) * m.stride(d);
      rest /= g.lead[d];
    }
    args.mask_at[b] = at;
  }
  args.mask_row_stride = m.stride(-2);
  args.mask_col_stride = m.stride(-1);
  return m;
}

// The kernels' arguments for contiguous operands; draws dropout's block.
KernelArgs kernel_args(const Geometry& g, const AttentionOptions& options) {
  KernelArgs args;
  args.dims = {g.bh, g.l, g.s, g.e, g.ev};
  args.out_at = attention_kernels::Layout::contiguous(g.l, g.ev);
  args.scale = scale_of(options, g);
  args.causal = options.causal;
  if (options.dropout > 0.0) {
    // As dropout() decides: kept when the draw is below (1 - p) * 2^32.
    Generator& gen = options.generator ? *options.generator : default_generator();
    const double p = options.dropout;
    args.dropout = {true, gen.seed(), gen.reserve(static_cast<uint64_t>(g.bh * g.l * g.s)),
                    static_cast<uint64_t>((1.0 - p) * 4294967296.0), 1.0 / (1.0 - p)};
  }
  return args;
}

// The rows' softmax statistics in one [2, bh, l] tensor: the maxima, then 1 / sums.
template <class T>
attention_kernels::Rows<T> rows_of(T* stats, const attention_kernels::Dims& d) {
  return {stats, stats + d.bh * d.l};
}

template <class T>
attention_kernels::Problem<T> problem(const KernelArgs& a, const T* q, const T* k, const T* v,
                                      const Tensor& mask) {
  attention_kernels::Problem<T> p;
  p.dims = a.dims;
  p.q = q, p.k = k, p.v = v;
  p.out_at = a.out_at;
  p.scale = static_cast<T>(a.scale);
  p.causal = a.causal;
  p.dropout = a.dropout;
  if (mask.defined()) {
    if (mask.dtype() == DType::boolean) p.mask.keep = mask.data_ptr<bool>();
    else p.mask.bias = mask.data_ptr<T>();
    p.mask.at = a.mask_at.data();
    p.mask.row_stride = a.mask_row_stride;
    p.mask.col_stride = a.mask_col_stride;
  }
  return p;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::lower, {q, k, v, options.mask})) {
    AttentionOptions cast_options = options;
    cast_options.mask = (*c)[3];
    return scaled_dot_product_attention((*c)[0], (*c)[1], (*c)[2], cast_options);
  }
  const Geometry g = check_args(q, k, v, options);
  // No device has an attention kernel yet (cuDNN's comes later): compose it.
  if (!q.device().is_cpu()) return scaled_dot_product_attention_math(q, k, v, options);

  if (auto low = detail::cpu_reduced_dtype({q, k, v, options.mask}))
    return detail::in_f32(*low, {q, k, v, options.mask}, [&](const auto& in) {
      AttentionOptions wide_options = options;
      wide_options.mask = in[3];
      return scaled_dot_product_attention(in[0], in[1], in[2], wide_options);
    });
  LOCKSTEP_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::f64,
                 "{}: dtype {} is not supported on CPU; use f32 or f64 (convert with "
                 ".to(DType::f32))", kOp, dtype_name(q.dtype()));
  KernelArgs args = kernel_args(g, options);
  const Tensor mask = expand_mask(options.mask, g, args);
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  Tensor out = Tensor::empty(g.shape(g.l, g.ev), q.dtype());
  Tensor stats = Tensor::empty({2, g.bh, g.l}, q.dtype());
  dispatch_float(q.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    attention_kernels::forward(problem<T>(args, qc.data_ptr<T>(), kc.data_ptr<T>(),
                                          vc.data_ptr<T>(), mask),
                               out.data_ptr<T>(), rows_of(stats.data_ptr<T>(), args.dims));
  });

  std::vector<Tensor> saved = {qc, kc, vc, out, stats, mask};
  return record(
      std::move(out), "ScaledDotProductAttentionBackward", {q, k, v}, std::move(saved),
      [args = std::move(args)](const BackwardArgs& a) {
        // On the CPU: other devices took the math path, whose ops record themselves.
        const Tensor &qs = a.saved[0], &ks = a.saved[1], &vs = a.saved[2];
        const Tensor &os = a.saved[3], &ls = a.saved[4], &ms = a.saved[5];
        const Tensor gout = a.grad.to(qs.dtype()).contiguous();
        std::vector<Tensor> grads(3);
        for (int i = 0; i < 3; ++i)
          if (a.needs[i]) grads[i] = Tensor::zeros(a.saved[i].shape(), qs.dtype());
        dispatch_float(qs.dtype(), "scaled_dot_product_attention backward", [&](auto tag) {
          using T = decltype(tag);
          auto ptr = [&](int i) { return grads[i].defined() ? grads[i].data_ptr<T>() : nullptr; };
          attention_kernels::backward(problem<T>(args, qs.data_ptr<T>(), ks.data_ptr<T>(),
                                                 vs.data_ptr<T>(), ms),
                                      os.data_ptr<T>(),
                                      rows_of<const T>(ls.data_ptr<T>(), args.dims),
                                      gout.data_ptr<T>(), ptr(0), ptr(1), ptr(2));
        });
        return grads;
      });
}

namespace {
constexpr const char* kPackedOp = "attention_from_qkv";

// qkv [B, T, 3C] with C a positive multiple of num_heads: for both entry
// points, the composed one too (num_heads = 0 divided by zero there, and a
// last dim of 10 silently left its last column out of q, k and v).
void check_packed(const Tensor& qkv, int64_t num_heads) {
  LOCKSTEP_CHECK(qkv.defined() && qkv.dim() == 3,
                 "{}: qkv must be [B, T, 3C] (q, k and v side by side in the last dim), got {}",
                 kPackedOp, qkv.defined() ? shape_str(qkv.shape()) : std::string("undefined"));
  LOCKSTEP_CHECK(num_heads >= 1 && qkv.size(2) % (3 * num_heads) == 0 && qkv.size(2) > 0,
                 "{}: the last dim of qkv {} must be 3 * C with C a positive multiple of "
                 "num_heads = {}",
                 kPackedOp, shape_str(qkv.shape()), num_heads);
}
}  // namespace

Tensor attention_from_qkv_composed(const Tensor& qkv, int64_t num_heads,
                                   const AttentionOptions& options) {
  check_packed(qkv, num_heads);
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, hs = c / num_heads;
  const auto part = [&](int64_t i) {  // [B, T, C] -> [B, H, T, hs]
    return qkv.slice(2, i * c, (i + 1) * c).reshape({b, t, num_heads, hs}).transpose(1, 2);
  };
  const Tensor y = scaled_dot_product_attention(part(0), part(1), part(2), options);
  return y.transpose(1, 2).reshape({b, t, c});
}

Tensor attention_from_qkv(const Tensor& qkv, int64_t num_heads, const AttentionOptions& options) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::lower, {qkv, options.mask})) {
    AttentionOptions cast_options = options;
    cast_options.mask = (*c)[1];
    return attention_from_qkv((*c)[0], num_heads, cast_options);
  }
  check_packed(qkv, num_heads);
  const bool blocked = qkv.device().is_cpu() &&
                       (qkv.dtype() == DType::f32 || qkv.dtype() == DType::f64) &&
                       (!options.mask.defined() || options.mask.device().is_cpu());
  if (!blocked) return attention_from_qkv_composed(qkv, num_heads, options);

  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, hs = c / num_heads;
  Geometry g;
  g.lead = {b, num_heads};
  g.bh = b * num_heads;
  g.l = g.s = t;
  g.e = g.ev = hs;
  check_options(options, g, qkv);
  KernelArgs args = kernel_args(g, options);
  // q, k and v as [3, B, H, T, hs] in one pass: the tile products run on
  // contiguous heads (read in place from the packed rows, OpenBLAS's packing
  // of the strided tiles cost what this copy saves). The output goes straight
  // to [B, T, C]: head h of sample n in columns [h * hs, (h + 1) * hs).
  const Tensor x = qkv.reshape({b, t, 3, num_heads, hs}).permute({2, 0, 3, 1, 4}).contiguous();
  args.out_at = {num_heads, t * c, hs, c};
  const Tensor mask = expand_mask(options.mask, g, args);
  Tensor out = Tensor::empty({b, t, c}, x.dtype());
  Tensor stats = Tensor::empty({2, g.bh, t}, x.dtype());
  const int64_t part = g.bh * t * hs;  // elements of each of q, k and v
  dispatch_float(x.dtype(), kPackedOp, [&](auto tag) {
    using T = decltype(tag);
    const T* base = x.data_ptr<T>();
    attention_kernels::forward(problem<T>(args, base, base + part, base + 2 * part, mask),
                               out.data_ptr<T>(), rows_of(stats.data_ptr<T>(), args.dims));
  });

  std::vector<Tensor> saved = {x, out, stats, mask};
  return record(
      std::move(out), "AttentionFromQkvBackward", {qkv}, std::move(saved),
      [args = std::move(args), part, b, t, c](const BackwardArgs& a) {
        const Tensor &xs = a.saved[0], &os = a.saved[1], &ls = a.saved[2], &ms = a.saved[3];
        const Tensor gout = a.grad.to(xs.dtype()).contiguous();
        // dq, dk and dv as the kernel reads q, k and v; one pass packs them
        // as qkv was: one gradient, where three slices would add three
        // zero-padded [B, T, 3C] tensors.
        Tensor heads_grad = Tensor::zeros(xs.shape(), xs.dtype());
        dispatch_float(xs.dtype(), "attention_from_qkv backward", [&](auto tag) {
          using T = decltype(tag);
          const T* base = xs.data_ptr<T>();
          T* d = heads_grad.data_ptr<T>();
          attention_kernels::backward(problem<T>(args, base, base + part, base + 2 * part, ms),
                                      os.data_ptr<T>(),
                                      rows_of<const T>(ls.data_ptr<T>(), args.dims),
                                      gout.data_ptr<T>(), d, d + part, d + 2 * part);
        });
        return std::vector<Tensor>{heads_grad.permute({1, 3, 0, 2, 4}).reshape({b, t, 3 * c})};
      });
}

}  // namespace lockstep::runtime
