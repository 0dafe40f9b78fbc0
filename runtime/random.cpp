#include "lockstep/runtime/random.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/half.h"

namespace lockstep::runtime {

namespace {

/*
 * Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11): ten rounds of a multiply-xor network over a 128-bit counter
 * keyed by the 64-bit seed. Block i of the stream is philox(counter = i,
 * key = seed) and yields 4 draws, so draw j is word j % 4 of block j / 4:
 * any position can be computed directly, with no sequential state.
 */
struct Block {
  uint32_t w[4];
};

Block philox(uint64_t counter, uint64_t seed) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = static_cast<uint32_t>(p1);
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

constexpr double kTwoPi = 6.283185307179586;

void check_float(const Tensor& t, const char* op) {
  LOCKSTEP_CHECK(is_floating(t.dtype()), "{}: needs a floating tensor (f32, f64, bf16 or f16), "
                 "got {}", op, dtype_name(t.dtype()));
}

// The value of T next below `top` (finite), towards -infinity.
template <class T>
T next_below(T top) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::nextafter(top, -std::numeric_limits<T>::infinity());
  } else {  // bf16, f16: sign and magnitude bits, so one step of the magnitude
    T r = top;
    if ((r.bits & 0x7fffu) == 0) r.bits = 0x8001u;  // +-0: the negative subnormal
    else if (r.bits & 0x8000u) ++r.bits;            // negative: larger magnitude
    else --r.bits;                                   // positive: smaller magnitude
    return r;
  }
}

// Fills t (any layout) from per-element values computed in logical order:
// next_value(T{}) gives one, T the C++ type of t's dtype (bf16 and f16 take
// the same draws as f32, each value rounded once to 16 bits).
template <class F>
void fill_with(Tensor& t, F next_value) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  dispatch_floating(t.dtype(), "random fill", [&](auto tag) {
    using T = decltype(tag);
    T* p = c.data_ptr<T>();
    const int64_t n = c.numel();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(next_value(T{}));
  });
  NoGradGuard no_grad;
  t.copy_(c);
}

}  // namespace

void philox_u32(uint64_t seed, uint64_t at, uint32_t* out, size_t n) {
  size_t i = 0;
  while (i < n) {
    Block b = philox(at / 4, seed);
    for (uint64_t w = at % 4; w < 4 && i < n; ++w, ++i, ++at) out[i] = b.w[w];
  }
}

namespace detail {
namespace {
thread_local DrawLog* t_draw_log = nullptr;
}  // namespace
DrawLog* current_draw_log() { return t_draw_log; }
void set_current_draw_log(DrawLog* log) { t_draw_log = log; }
}  // namespace detail

Generator& Generator::operator=(const Generator& other) {
  if (detail::DrawLog* log = detail::t_draw_log) log->setting(*this);
  seed_ = other.seed_;
  offset_ = other.offset();
  return *this;
}

Generator::~Generator() {
  if (detail::DrawLog* log = detail::t_draw_log) log->destroying(*this);
}

void Generator::manual_seed(uint64_t seed) {
  if (detail::DrawLog* log = detail::t_draw_log) log->setting(*this);
  seed_ = seed;
  offset_ = 0;
}

void Generator::set_offset(uint64_t offset) {
  if (detail::DrawLog* log = detail::t_draw_log) log->setting(*this);
  offset_ = offset;
}

uint64_t Generator::reserve(uint64_t n) {
  if (detail::DrawLog* log = detail::t_draw_log) return log->reserve(*this, n);
  return take(n);
}

void Generator::fill_u32(uint32_t* out, size_t n) { philox_u32(seed_, reserve(n), out, n); }

uint32_t Generator::next_u32() {
  uint32_t v;
  fill_u32(&v, 1);
  return v;
}

double Generator::next_uniform() {
  uint32_t v[2];
  fill_u32(v, 2);
  uint64_t bits = (static_cast<uint64_t>(v[0]) << 21) ^ (v[1] >> 11);  // 53 bits
  return static_cast<double>(bits & ((1ull << 53) - 1)) * 0x1.0p-53;
}

Generator& default_generator() {
  static Generator g(0);
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

Tensor& uniform_(Tensor& t, double lo, double hi, Generator& g) {
  check_float(t, "uniform_");
  // As PyTorch: a range the dtype cannot hold would fill infinities (f16's
  // largest is 65504).
  const DType dt = t.dtype();
  LOCKSTEP_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi && holds_value(dt, lo) &&
                     holds_value(dt, hi) && holds_value(dt, hi - lo),
                 "uniform_: [{}, {}) is not a range of {} values: lo <= hi must hold, and lo, "
                 "hi and hi - lo must be finite in {}; narrow the range or fill a wider dtype "
                 "and convert",
                 lo, hi, dtype_name(dt), dtype_name(dt));
  const double span = hi - lo;
  fill_with(t, [&](auto tag) {
    using T = decltype(tag);
    // A draw just below hi can round up to it in T (an f32 rand() gave 1.0
    // once in 2^25 draws): it takes the T next below, so values stay in [lo, hi).
    const T v = static_cast<T>(lo + span * g.next_uniform());
    const T top = static_cast<T>(hi), bottom = static_cast<T>(lo);
    return v >= top && bottom < top ? next_below(top) : v;
  });
  return t;
}

Tensor& normal_(Tensor& t, double mean, double std, Generator& g) {
  check_float(t, "normal_");
  // As PyTorch: a negative or NaN std is refused, not drawn as -std or NaN.
  LOCKSTEP_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0.0,
                 "normal_: mean {} and std {} do not describe a normal distribution: both must "
                 "be finite and std at least 0",
                 mean, std);
  // Box-Muller, both values of each pair used.
  bool have_spare = false;
  double spare = 0;
  fill_with(t, [&](auto) {
    if (have_spare) {
      have_spare = false;
      return mean + std * spare;
    }
    double u1 = g.next_uniform(), u2 = g.next_uniform();
    double r = std::sqrt(-2.0 * std::log1p(-u1));  // 1 - u1 in (0, 1]: log is finite
    spare = r * std::sin(kTwoPi * u2);
    have_spare = true;
    return mean + std * r * std::cos(kTwoPi * u2);
  });
  return t;
}

std::pair<int64_t, int64_t> fan_in_and_out(const Shape& shape) {
  LOCKSTEP_CHECK(shape.size() >= 2,
                 "fan in and fan out need a tensor with at least 2 dims, got shape {}",
                 shape_str(shape));
  int64_t receptive = 1;
  for (size_t i = 2; i < shape.size(); ++i) receptive *= shape[i];
  return {shape[1] * receptive, shape[0] * receptive};
}

namespace {
double leaky_relu_gain(double a) { return std::sqrt(2.0 / (1.0 + a * a)); }
}  // namespace

Tensor& kaiming_uniform_(Tensor& t, double a, Generator& g) {
  if (t.numel() == 0) return t;  // no fan to divide by (Linear(0, n)): as PyTorch, a no-op
  double bound = std::sqrt(3.0) * leaky_relu_gain(a) / std::sqrt(double(fan_in_and_out(t.shape()).first));
  return uniform_(t, -bound, bound, g);
}

Tensor& kaiming_normal_(Tensor& t, double a, Generator& g) {
  if (t.numel() == 0) return t;  // no fan to divide by (Linear(0, n)): as PyTorch, a no-op
  double std = leaky_relu_gain(a) / std::sqrt(double(fan_in_and_out(t.shape()).first));
  return normal_(t, 0.0, std, g);
}

Tensor& xavier_uniform_(Tensor& t, double gain, Generator& g) {
  if (t.numel() == 0) return t;  // no fan to divide by (Linear(0, n)): as PyTorch, a no-op
  auto [fan_in, fan_out] = fan_in_and_out(t.shape());
  double bound = gain * std::sqrt(6.0 / double(fan_in + fan_out));
  return uniform_(t, -bound, bound, g);
}

Tensor& xavier_normal_(Tensor& t, double gain, Generator& g) {
  if (t.numel() == 0) return t;  // no fan to divide by (Linear(0, n)): as PyTorch, a no-op
  auto [fan_in, fan_out] = fan_in_and_out(t.shape());
  return normal_(t, 0.0, gain * std::sqrt(2.0 / double(fan_in + fan_out)), g);
}

Tensor rand(const Shape& shape, DType dtype, Generator& g) {
  Tensor t = Tensor::empty(shape, dtype);
  return uniform_(t, 0.0, 1.0, g);
}

Tensor randn(const Shape& shape, DType dtype, Generator& g) {
  Tensor t = Tensor::empty(shape, dtype);
  return normal_(t, 0.0, 1.0, g);
}

std::vector<int64_t> randperm(int64_t n, Generator& g) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(g.next_uniform() * static_cast<double>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

}  // namespace lockstep::runtime
