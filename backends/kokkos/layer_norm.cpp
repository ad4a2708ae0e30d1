#include "kokkos/layer_norm.hpp"

#include "hk/error.hpp"

namespace hk::kokkos {
namespace {

// Rows per team: amortises the per-team dispatch on a host backend (one team is one thread's
// batch of rows there); on a GPU the team's threads take one row each, lanes split D.
constexpr int kRowsPerTeam = 8;

// Mode of one launch: what is added before the statistics, what is written.
enum class Mode { plain, add_bias, final };

template <class T, class XView, Mode kMode, bool kBias>
struct LayerNormRows {
  XView x;  // Mat<T> in Mode::add_bias (written back), else ConstMat<T>
  ConstVec<T> bias, w, b;
  Mat<T> out;
  Lengths lengths;  // Mode::final
  int rows, cols, seq_len;
  T eps;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& m) const {
    const int r0 = m.league_rank() * kRowsPerTeam;
    const int nr = rows - r0 < kRowsPerTeam ? rows - r0 : kRowsPerTeam;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, nr), [&](int k) {
      const int r = r0 + k;
      const int D = cols;
      if (kMode == Mode::final && r % seq_len >= lengths(r / seq_len)) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, D), [&](int c) { out(r, c) = T(0); });
        return;
      }
      const T* xr = &x(r, 0);
      const T* bi = kBias ? &bias(0) : nullptr;
      // Statistics of the row shifted by its first element: a constant row (or one with a large
      // common offset) centres to exact zeros instead of to the rounding error of its mean.
      const T shift = kBias ? xr[0] + bi[0] : xr[0];
      T sum = 0;
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(m, D),
          [&](int c, T& s) { s += (kBias ? xr[c] + bi[c] : xr[c]) - shift; }, sum);
      const T mean = sum / T(D);  // of the shifted row
      T sq = 0;
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(m, D),
          [&](int c, T& s) {
            const T v = ((kBias ? xr[c] + bi[c] : xr[c]) - shift) - mean;
            s += v * v;
          },
          sq);
      const T rstd = T(1) / kmath::sqrt(sq / T(D) + eps);
      T* o = &out(r, 0);
      const T* wp = &w(0);
      const T* bp = &b(0);
      if constexpr (kMode == Mode::add_bias) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, D), [&](int c) {
          const T v = xr[c] + bi[c];
          x(r, c) = v;
          o[c] = ((v - shift) - mean) * rstd * wp[c] + bp[c];
        });
      } else {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, D), [&](int c) {
          const T v = kBias ? xr[c] + bi[c] : xr[c];
          o[c] = ((v - shift) - mean) * rstd * wp[c] + bp[c];
        });
      }
    });
  }
};

template <class T, Mode kMode, bool kBias, class XView>
void launch(const char* label, const XView& x, const ConstVec<T>& bias,
            const ConstVec<T>& w, const ConstVec<T>& b, double eps, const Lengths& lengths, int seq_len,
            const Mat<T>& out) {
  const int rows = int(x.extent(0)), cols = int(x.extent(1));
  if (rows == 0) return;
  LayerNormRows<T, XView, kMode, kBias> f{x, bias, w, b, out, lengths, rows, cols, seq_len, T(eps)};
  const int vec = TeamPolicy::vector_length_max() < 32 ? TeamPolicy::vector_length_max() : 32;
  Kokkos::parallel_for(label, TeamPolicy((rows + kRowsPerTeam - 1) / kRowsPerTeam, Kokkos::AUTO, vec), f);
}

template <class T>
void check_row_shapes(const char* op, size_t xr, size_t xc, const ConstVec<T>& w, const ConstVec<T>& b,
                      size_t outr, size_t outc) {
  if (w.extent(0) != xc || b.extent(0) != xc || outr != xr || outc != xc)
    throw Error(std::string(op) + ": shape mismatch");
}

}  // namespace

template <class T>
void layer_norm(const ConstMat<T>& x, const ConstVec<T>& w, const ConstVec<T>& b, double eps, const Mat<T>& h) {
  check_row_shapes("hk::layer_norm[kokkos]", x.extent(0), x.extent(1), w, b, h.extent(0), h.extent(1));
  launch<T, Mode::plain, false>("hk::layer_norm[kokkos]", x, ConstVec<T>(), w, b, eps, Lengths(), 1, h);
}

template <class T>
void add_layer_norm(const Mat<T>& x, const ConstVec<T>& bias, const ConstVec<T>& w, const ConstVec<T>& b,
                    double eps, const Mat<T>& h) {
  check_row_shapes("hk::add_layer_norm[kokkos]", x.extent(0), x.extent(1), w, b, h.extent(0), h.extent(1));
  if (bias.extent(0) != x.extent(1)) throw Error("hk::add_layer_norm[kokkos]: bias shape mismatch");
  launch<T, Mode::add_bias, true>("hk::add_layer_norm[kokkos]", x, bias, w, b, eps, Lengths(), 1, h);
}

template <class T>
void final_layer_norm(const ConstMat<T>& x, const ConstVec<T>& bias, const ConstVec<T>& w, const ConstVec<T>& b,
                      double eps, const Lengths& lengths, int seq_len, const Mat<T>& y) {
  check_row_shapes("hk::final_layer_norm[kokkos]", x.extent(0), x.extent(1), w, b, y.extent(0), y.extent(1));
  if (bias.extent(0) != 0 && bias.extent(0) != x.extent(1))
    throw Error("hk::final_layer_norm[kokkos]: bias shape mismatch");
  if (seq_len < 1 || x.extent(0) % size_t(seq_len) != 0 || lengths.extent(0) < x.extent(0) / size_t(seq_len))
    throw Error("hk::final_layer_norm[kokkos]: rows are not [B, S] with B lengths");
  if (bias.extent(0) != 0)
    launch<T, Mode::final, true>("hk::final_layer_norm[kokkos]", x, bias, w, b, eps, lengths, seq_len, y);
  else
    launch<T, Mode::final, false>("hk::final_layer_norm[kokkos]", x, bias, w, b, eps, lengths, seq_len, y);
}

#define HK_KOKKOS_INSTANTIATE(T)                                                                               \
  template void layer_norm<T>(const ConstMat<T>&, const ConstVec<T>&, const ConstVec<T>&, double, const Mat<T>&); \
  template void add_layer_norm<T>(const Mat<T>&, const ConstVec<T>&, const ConstVec<T>&, const ConstVec<T>&,    \
                                  double, const Mat<T>&);                                                       \
  template void final_layer_norm<T>(const ConstMat<T>&, const ConstVec<T>&, const ConstVec<T>&,                \
                                    const ConstVec<T>&, double, const Lengths&, int, const Mat<T>&);
HK_KOKKOS_INSTANTIATE(float)
HK_KOKKOS_INSTANTIATE(double)
#undef HK_KOKKOS_INSTANTIATE

}  // namespace hk::kokkos
