// reccl/policy/telemetry/cost_model.hpp -- the cost model T = α·stalls + β·bytes + Δ.
//
//   host, one rank, every so often                      every rank, every collective (host or device)
//   ┌──────────────────────────────────────┐            ┌────────────────────────────────────────┐
//   │ cost_model<W>: last W samples        │  quantize  │ cost_model_q: integer α, β (Q24), Δ    │
//   │ (stalls, bytes, measured time ns)    │ ─────────▶ │ + from_epoch; eval(stalls, bytes) → ns │
//   │ least squares in double, R²          │ broadcast  │ the same bits everywhere               │
//   └──────────────────────────────────────┘            └────────────────────────────────────────┘
//
// α prices a stall (ns per failed credit poll), β a byte (ns per byte: 1/bandwidth), Δ the fixed
// cost of a VT's block (launch, the first hop's latency). The fit runs on the host in double
// precision over a sliding window; what the ranks evaluate is the quantized form, so that every
// rank turns the same counts into the same time estimate, bit for bit (nvcc contracts float
// multiply-adds, so a float formula would not). Samples differ per rank: fit on one rank and
// broadcast the 32-byte cost_model_q, tagged with the first epoch it applies to, so that every
// rank switches at the same collective.
#pragma once

#include <cstdint>

#include "../../config.hpp"

namespace reccl::telemetry {

/// The quantized cost model every rank evaluates. Coefficients are non-negative integers: α and β
/// in Q24 nanoseconds (below 2^40, i.e. at most 65536 ns per stall or per byte), Δ in nanoseconds.
/// The defaults are an uncalibrated prior (100 ns per stall, 50 GB/s, no fixed cost) for the
/// epochs before the first fit.
struct cost_model_q {
  static constexpr int frac_bits = 24;
  static constexpr std::uint64_t coef_limit = (std::uint64_t{1} << 40) - 1;
  std::uint64_t alpha = std::uint64_t{100} << frac_bits;  ///< ns per stall, Q24
  std::uint64_t beta = 335544;                            ///< ns per byte, Q24 (0.02 ns/B = 50 GB/s)
  std::uint64_t delta = 0;                                ///< ns per VT block
  std::uint64_t from_epoch = 0;                           ///< first epoch whose records this model evaluates

  /// Estimated time in ns of a VT's block with these counts: floor(α·stalls) + floor(β·bytes) + Δ,
  /// saturating at 2^64 - 1. Integer only. Coefficients above coef_limit are read as coef_limit.
  RECCL_HOST_DEVICE constexpr std::uint64_t eval(std::uint64_t stalls, std::uint64_t bytes) const {
    return add_sat(add_sat(mul_q(stalls, alpha), mul_q(bytes, beta)), delta);
  }

  constexpr bool operator==(cost_model_q const&) const = default;

 private:
  RECCL_HOST_DEVICE static constexpr std::uint64_t add_sat(std::uint64_t a, std::uint64_t b) {
    return a + b < a ? ~std::uint64_t{0} : a + b;
  }
  /// floor(x · c / 2^24) without a 128-bit product: x = hi · 2^24 + lo.
  RECCL_HOST_DEVICE static constexpr std::uint64_t mul_q(std::uint64_t x, std::uint64_t c) {
    if (c > coef_limit) c = coef_limit;
    std::uint64_t const hi = x >> frac_bits, lo = x & ((std::uint64_t{1} << frac_bits) - 1);
    std::uint64_t const low = (lo * c) >> frac_bits;  // lo < 2^24, c < 2^40
    // hi < 2^24 (x < 2^48) cannot overflow: hi · c < 2^64 - 2^40. Only beyond that, the division.
    if ((hi >> 24) != 0 && c > (~std::uint64_t{0} - low) / hi) return ~std::uint64_t{0};
    return hi * c + low;
  }
};

/// One observation for the fit: a VT block's counts and its measured duration.
struct cost_sample {
  std::uint64_t stalls = 0;
  std::uint64_t bytes = 0;
  double time_ns = 0;
};

/// Result of a least-squares fit. `ok` needs at least 3 samples. A coefficient whose regressor
/// did not vary in the window (or varied only in proportion to the other) cannot be told apart
/// from the others: it is reported as 0 with its `_identified` flag false, and the fit uses the
/// remaining regressors. `r2` is the fraction of the time variance the model explains (1 when the
/// times do not vary and the fit is exact).
struct cost_fit {
  bool ok = false;
  int samples = 0;
  double alpha = 0, beta = 0, delta = 0;
  double r2 = 0;
  bool alpha_identified = false, beta_identified = false;
};

/// Host-side cost model fit over a sliding window of the last `Window` samples. Fixed storage,
/// no heap; fit() is O(Window) and numerically centered (no running sums of squares that cancel).
template <int Window = 1024>
class cost_model {
  static_assert(Window >= 3, "a window of fewer than 3 samples cannot fit 3 coefficients");

 public:
  /// Adds a sample; the oldest one drops out once the window is full.
  void add(std::uint64_t stalls, std::uint64_t bytes, double time_ns) {
    buf_[head_] = cost_sample{stalls, bytes, time_ns};
    head_ = (head_ + 1) % Window;
    if (size_ < Window) ++size_;
  }
  void clear() { head_ = size_ = 0; }
  int size() const { return size_; }
  static constexpr int window() { return Window; }

  /// Least-squares fit of T = α·stalls + β·bytes + Δ over the samples in the window.
  cost_fit fit() const {
    cost_fit r;
    r.samples = size_;
    if (size_ < 3) return r;
    double const n = size_;
    double ms = 0, mb = 0, mt = 0;
    for (int i = 0; i < size_; ++i) {
      ms += static_cast<double>(buf_[i].stalls);
      mb += static_cast<double>(buf_[i].bytes);
      mt += buf_[i].time_ns;
    }
    ms /= n, mb /= n, mt /= n;
    double sss = 0, sbb = 0, ssb = 0, sst = 0, sbt = 0, stt = 0;
    for (int i = 0; i < size_; ++i) {
      double const s = static_cast<double>(buf_[i].stalls) - ms, b = static_cast<double>(buf_[i].bytes) - mb,
                   t = buf_[i].time_ns - mt;
      sss += s * s, sbb += b * b, ssb += s * b, sst += s * t, sbt += b * t, stt += t * t;
    }
    // A regressor "varies" when its spread is above rounding noise relative to its magnitude.
    bool const s_var = sss > 1e-12 * n * (ms * ms + 1.0);
    bool const b_var = sbb > 1e-12 * n * (mb * mb + 1.0);
    double const det = sss * sbb - ssb * ssb;
    if (s_var && b_var && det > 1e-9 * sss * sbb) {
      r.alpha = (sst * sbb - sbt * ssb) / det;
      r.beta = (sbt * sss - sst * ssb) / det;
      r.alpha_identified = r.beta_identified = true;
    } else if (b_var) {  // stalls constant, or moving in lockstep with bytes: bytes explain both
      r.beta = sbt / sbb;
      r.beta_identified = true;
    } else if (s_var) {
      r.alpha = sst / sss;
      r.alpha_identified = true;
    }
    r.delta = mt - r.alpha * ms - r.beta * mb;
    double res = 0;
    for (int i = 0; i < size_; ++i) {
      double const e = buf_[i].time_ns - (r.alpha * static_cast<double>(buf_[i].stalls) +
                                          r.beta * static_cast<double>(buf_[i].bytes) + r.delta);
      res += e * e;
    }
    r.r2 = stt > 0 ? 1.0 - res / stt : (res == 0 ? 1.0 : 0.0);
    r.ok = true;
    return r;
  }

 private:
  cost_sample buf_[Window] = {};
  int head_ = 0, size_ = 0;
};

/// The integer model every rank evaluates, from a fit, applying from epoch `from_epoch`.
/// Negative coefficients (noise around a zero cost) become 0; each is rounded to nearest and
/// clamped to cost_model_q::coef_limit. Host-side: run it once and broadcast the result.
inline cost_model_q quantize(cost_fit const& f, std::uint64_t from_epoch) {
  auto q = [](double x, double scale, std::uint64_t limit) -> std::uint64_t {
    if (!(x > 0)) return 0;  // also maps NaN to 0
    double const v = x * scale + 0.5;
    return v >= static_cast<double>(limit) ? limit : static_cast<std::uint64_t>(v);
  };
  double const one = static_cast<double>(std::uint64_t{1} << cost_model_q::frac_bits);
  cost_model_q m;
  m.alpha = q(f.alpha, one, cost_model_q::coef_limit);
  m.beta = q(f.beta, one, cost_model_q::coef_limit);
  m.delta = q(f.delta, 1.0, ~std::uint64_t{0} >> 1);
  m.from_epoch = from_epoch;
  return m;
}

}  // namespace reccl::telemetry
