#include "kokkos/linear.hpp"

#include <KokkosBlas3_gemm.hpp>
#include <string>

#include "hk/error.hpp"
#include "kokkos/math.hpp"

namespace hk::kokkos {
namespace {

// Rows per team of the epilogues: as in layer_norm.cpp, amortises team dispatch on a host.
constexpr int kRowsPerTeam = 8;

template <class T, bool kGelu>
struct BiasRows {
  Mat<T> y;
  ConstVec<T> bias;
  int rows, cols;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& m) const {
    const int r0 = m.league_rank() * kRowsPerTeam;
    const int nr = rows - r0 < kRowsPerTeam ? rows - r0 : kRowsPerTeam;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, nr), [&](int k) {
      T* yr = &y(r0 + k, 0);
      const T* b = &bias(0);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, cols), [&](int c) {
        const T v = yr[c] + b[c];
        yr[c] = kGelu ? gelu(v) : v;
      });
    });
  }
};

template <class T, bool kGelu>
void bias_rows(const char* label, const Mat<T>& y, const ConstVec<T>& bias) {
  if (bias.extent(0) != y.extent(1)) throw Error(std::string(label) + ": bias shape mismatch");
  const int rows = int(y.extent(0));
  if (rows == 0) return;
  const int vec = TeamPolicy::vector_length_max() < 32 ? TeamPolicy::vector_length_max() : 32;
  Kokkos::parallel_for(label, TeamPolicy((rows + kRowsPerTeam - 1) / kRowsPerTeam, Kokkos::AUTO, vec),
                       BiasRows<T, kGelu>{y, bias, rows, int(y.extent(1))});
}

}  // namespace

template <class T>
void gemm_nt(const ConstMat<T>& in, const ConstMat<T>& W, T beta, const Mat<T>& out) {
  if (in.extent(1) != W.extent(1) || out.extent(0) != in.extent(0) || out.extent(1) != W.extent(0))
    throw Error("hk::linear[kokkos]: shape mismatch");
  if (out.extent(0) == 0 || out.extent(1) == 0) return;
  Kokkos::Profiling::pushRegion("hk::linear[kokkos]");
  KokkosBlas::gemm("N", "T", T(1), in, W, beta, out);
  Kokkos::Profiling::popRegion();
}

template <class T>
void add_bias(const Mat<T>& y, const ConstVec<T>& bias) {
  bias_rows<T, false>("hk::add_bias[kokkos]", y, bias);
}

template <class T>
void bias_gelu(const Mat<T>& y, const ConstVec<T>& bias) {
  bias_rows<T, true>("hk::bias_gelu[kokkos]", y, bias);
}

#define HK_KOKKOS_INSTANTIATE(T)                                                          \
  template void gemm_nt<T>(const ConstMat<T>&, const ConstMat<T>&, T, const Mat<T>&);    \
  template void add_bias<T>(const Mat<T>&, const ConstVec<T>&);                          \
  template void bias_gelu<T>(const Mat<T>&, const ConstVec<T>&);
HK_KOKKOS_INSTANTIATE(float)
HK_KOKKOS_INSTANTIATE(double)
#undef HK_KOKKOS_INSTANTIATE

}  // namespace hk::kokkos
