#include "kokkos/attention.hpp"

#include <string>

#include "hk/error.hpp"
#include "kokkos/math.hpp"

namespace hk::kokkos {
namespace {

// ---- tiles ---------------------------------------------------------------------------------
// Query rows are processed in groups of kLanes, one row per vector lane: every softmax
// reduction then runs along the key axis, which is sequential inside a lane, so a CPU keeps
// the row statistics in registers and needs no horizontal reductions (8 floats = one AVX2
// register). A GPU build maps the lanes onto 8 threads of a warp.
constexpr int kLanes = 8;
// Keys per K/V scratch tile: 2 x 64 x hd x 4 B = 16 KB at hd 32, so a tile and the group
// state of the rows being processed stay in a 32 KB L1.
constexpr int kKeyTile = 64;
// Keys (score phase) and head columns (P.V phase) advanced together: four independent
// accumulator chains hide the FMA latency on a CPU.
constexpr int kStep = 4;
static_assert(kStep == 4, "group_scores and group_pv spell out four keys / columns");
static_assert(kKeyTile % kStep == 0, "tiles hold whole key steps");

// Groups (of kLanes query rows) per team: the team's Q and O state, 2 x groups x kLanes x hd
// values, stays within 32 KB of floats, and more rows per team reuse each K/V tile more.
constexpr int kMaxGroups = 16;
int groups_per_team(int hd, int S) {
  int g = 32768 / int(2 * kLanes * hd * sizeof(float));
  g = g < 1 ? 1 : (g > kMaxGroups ? kMaxGroups : g);
  const int needed = (S + kLanes - 1) / kLanes;
  return g < needed ? g : needed;
}

// ---- per lane group: one tile of keys -----------------------------------------------------
// Lane w of a group is query row gi0 + w; q and acc hold Q^T and O^T ([hd][kLanes]), p the
// group's scores [keys][kLanes]. Each helper touches only its lanes' columns.
//
// GCC's loop vectoriser turns the two product loops below inside out (it vectorises along
// keys or head columns and reshuffles the lane accumulators around every loop), which halves
// their speed; its basic-block vectoriser alone produces the intended one-register-per-lane-
// group code. So with GCC on a host build they are compiled without loop vectorisation, as
// separate functions (the attribute cannot apply to inlined code). Other compilers and device
// builds see plain inline functions.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && !defined(__INTEL_LLVM_COMPILER)
#define HK_KOKKOS_LANE_LOOPS __attribute__((optimize("no-tree-loop-vectorize"), noinline))
#else
#define HK_KOKKOS_LANE_LOOPS KOKKOS_INLINE_FUNCTION
#endif

// p[j][w] = q_w . K[j] for keys j < jsteps, kStep at a time.
template <class T>
HK_KOKKOS_LANE_LOOPS void group_scores(const Member& m, const T* q, const T* Kt, int hd, int jsteps, T* p) {
  for (int j = 0; j < jsteps; j += kStep) {
    T s[kStep][kLanes];
    for (int k = 0; k < kStep; ++k)
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) { s[k][w] = T(0); });
    // Pointers advance by whole rows: no per-element index arithmetic in the hot loop.
    const T* qcol = q;
    const T* kcol = Kt + j;
    for (int c = 0; c < hd; ++c, qcol += kLanes, kcol += kKeyTile) {
      const T k0 = kcol[0], k1 = kcol[1], k2 = kcol[2], k3 = kcol[3];
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) {
        const T qv = qcol[w];
        s[0][w] += qv * k0;
        s[1][w] += qv * k1;
        s[2][w] += qv * k2;
        s[3][w] += qv * k3;
      });
    }
    for (int k = 0; k < kStep; ++k)
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) { p[(j + k) * kLanes + w] = s[k][w]; });
  }
}

// p[j][w] = exp(p[j][w] - shift[w]); sum[w] = alpha[w] sum[w] + sum_j p[j][w].
template <class T>
KOKKOS_INLINE_FUNCTION void group_exp(const Member& m, int jsteps, const T* shift, const T* alpha, T* p, T* sum) {
  T part[kLanes];
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) { part[w] = T(0); });
  for (int j = 0; j < jsteps; ++j) {
    T* pj = p + j * kLanes;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) {
      const T e = hk_exp(pj[w] - shift[w]);
      pj[w] = e;
      part[w] += e;
    });
  }
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) { sum[w] = sum[w] * alpha[w] + part[w]; });
}

// acc[c][w] = alpha[w] acc[c][w] + sum_j p[j][w] V[j][c], kStep head columns at a time.
template <class T>
HK_KOKKOS_LANE_LOOPS void group_pv(const Member& m, const T* p, const T* V, int hd, int jsteps, const T* alpha,
                                     T* acc) {
  int c = 0;
  for (; c + kStep <= hd; c += kStep) {
    T a[kStep][kLanes];
    for (int k = 0; k < kStep; ++k)
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes),
                           [&](int w) { a[k][w] = acc[(c + k) * kLanes + w] * alpha[w]; });
    const T* pj = p;
    const T* vrow = V + c;
    for (int j = 0; j < jsteps; ++j, pj += kLanes, vrow += hd) {
      const T v0 = vrow[0], v1 = vrow[1], v2 = vrow[2], v3 = vrow[3];
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) {
        const T pv = pj[w];
        a[0][w] += pv * v0;
        a[1][w] += pv * v1;
        a[2][w] += pv * v2;
        a[3][w] += pv * v3;
      });
    }
    for (int k = 0; k < kStep; ++k)
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes),
                           [&](int w) { acc[(c + k) * kLanes + w] = a[k][w]; });
  }
  for (; c < hd; ++c) {  // head columns past the last whole step
    T a[kLanes];
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) { a[w] = acc[c * kLanes + w] * alpha[w]; });
    for (int j = 0; j < jsteps; ++j) {
      const T v = V[j * hd + c];
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) { a[w] += p[j * kLanes + w] * v; });
    }
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) { acc[c * kLanes + w] = a[w]; });
  }
}

template <class T, bool kBias>
struct AttentionTeams {
  ConstMat<T> qkv;
  ConstVec<T> bias;
  Lengths lengths;
  Mat<T> o;
  int S, H, hd, D, groups, qblocks, level;
  bool causal;
  T scale;

  // Scratch: the K^T and V tiles, then per group Q^T [hd][kLanes], O^T [hd][kLanes], scores
  // [kKeyTile][kLanes], running max and sum [kLanes].
  static size_t scratch_bytes(int hd, int groups) {
    using SV = ScratchVec<T>;
    return 2 * SV::shmem_size(size_t(kKeyTile) * hd) + 2 * SV::shmem_size(size_t(groups) * hd * kLanes) +
           SV::shmem_size(size_t(groups) * kKeyTile * kLanes) + 2 * SV::shmem_size(size_t(groups) * kLanes);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& m) const {
    // Masked scores: a finite stand-in for -inf (exp() of it is exactly 0), so that this file can
    // be compiled with -ffinite-math-only, which lets the running maximum vectorise.
    constexpr T kMasked = T(-1e30);
    const int qb = m.league_rank() % qblocks;
    const int h = (m.league_rank() / qblocks) % H;
    const int b = m.league_rank() / (qblocks * H);
    const int len = lengths(b);
    const int i0 = qb * groups * kLanes;                                      // first query row
    const int i_end = i0 + groups * kLanes < S ? i0 + groups * kLanes : S;    // past the last row
    const int v_end = len < i_end ? len : i_end;                              // past the last valid row
    const size_t row0 = size_t(b) * S;
    const int qc = h * hd, kc = D + h * hd, vc = 2 * D + h * hd;

    // Padded query rows: zeros.
    const int pad0 = v_end > i0 ? v_end : i0;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, pad0, i_end), [&](int i) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, hd), [&](int c) { o(row0 + i, qc + c) = T(0); });
    });
    if (v_end <= i0) return;
    const int ngroups = (v_end - i0 + kLanes - 1) / kLanes;
    const int kend = causal ? v_end : len;  // keys any valid row of this team may see

    ScratchVec<T> K(m.team_scratch(level), size_t(kKeyTile) * hd);
    ScratchVec<T> V(m.team_scratch(level), size_t(kKeyTile) * hd);
    ScratchVec<T> Q(m.team_scratch(level), size_t(groups) * hd * kLanes);
    ScratchVec<T> O(m.team_scratch(level), size_t(groups) * hd * kLanes);
    ScratchVec<T> P(m.team_scratch(level), size_t(groups) * kKeyTile * kLanes);
    ScratchVec<T> Mx(m.team_scratch(level), size_t(groups) * kLanes);
    ScratchVec<T> Sum(m.team_scratch(level), size_t(groups) * kLanes);

    // Q^T of each group, scaled by 1/sqrt(hd) (and biased); rows past v_end are zero lanes.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, ngroups), [&](int g) {
      T* q = &Q(size_t(g) * hd * kLanes);
      T* acc = &O(size_t(g) * hd * kLanes);
      const int gi0 = i0 + g * kLanes;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) {
        const int i = gi0 + w;
        if (i < v_end) {
          const T* src = &qkv(row0 + i, qc);
          for (int c = 0; c < hd; ++c) q[c * kLanes + w] = (src[c] + (kBias ? bias(qc + c) : T(0))) * scale;
        } else {
          for (int c = 0; c < hd; ++c) q[c * kLanes + w] = T(0);
        }
        for (int c = 0; c < hd; ++c) acc[c * kLanes + w] = T(0);
      });
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) {
        Mx(g * kLanes + w) = kMasked;
        Sum(g * kLanes + w) = T(0);
      });
    });

    for (int j0 = 0; j0 < kend; j0 += kKeyTile) {
      const int jn = kend - j0 < kKeyTile ? kend - j0 : kKeyTile;
      const int jn_pad = (jn + kStep - 1) / kStep * kStep;
      m.team_barrier();  // the previous tile is consumed
      // K^T [hd][kKeyTile] and V [kKeyTile][hd] of keys j0 .. j0+jn of this head, zero-padded to
      // whole key steps. K is stored transposed so that a CPU compiler vectorises the score loop
      // across query lanes (with K rows contiguous it vectorises along hd, through shuffles).
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, jn_pad), [&](int j) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, hd), [&](int c) {
          if (j < jn) {
            const size_t r = row0 + j0 + j;
            K(c * kKeyTile + j) = qkv(r, kc + c) + (kBias ? bias(kc + c) : T(0));
            V(j * hd + c) = qkv(r, vc + c) + (kBias ? bias(vc + c) : T(0));
          } else {
            K(c * kKeyTile + j) = T(0);
            V(j * hd + c) = T(0);
          }
        });
      });
      m.team_barrier();

      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, ngroups), [&](int g) {
        const int gi0 = i0 + g * kLanes;
        const int glast = (gi0 + kLanes < v_end ? gi0 + kLanes : v_end) - 1;  // last valid row
        // Keys of this tile that some row of the group may see.
        int jlim = jn;
        if (causal && glast + 1 - j0 < jlim) jlim = glast + 1 - j0;
        if (jlim <= 0) return;  // the whole tile lies in every row's future
        const int jsteps = (jlim + kStep - 1) / kStep * kStep;
        const T* q = &Q(size_t(g) * hd * kLanes);
        T* acc = &O(size_t(g) * hd * kLanes);
        T* p = &P(size_t(g) * kKeyTile * kLanes);
        const T* Kt = &K(0);
        const T* Vt = &V(0);

        // Per lane: keys [0, lim) of this tile are allowed.
        T lim[kLanes];
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) {
          const int i = gi0 + w;
          const int l = i >= v_end ? 0 : (causal ? i + 1 - j0 : jn);
          lim[w] = T(l < 0 ? 0 : (l > jlim ? jlim : l));
        });
        T mx[kLanes], shift[kLanes], alpha[kLanes];
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) { mx[w] = Mx(g * kLanes + w); });
        group_scores(m, q, Kt, hd, jsteps, p);
        // Masks (kMasked past each lane's limit) and the running maximum. Kept out of
        // group_scores: its conditionals need the loop vectoriser's if-conversion.
        for (int j = 0; j < jsteps; ++j) {
          T* pj = p + j * kLanes;
          const T key = T(j);  // compared as T: the lane loop stays in one type
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) {
            const T v = key < lim[w] ? pj[w] : kMasked;
            pj[w] = v;
            mx[w] = v > mx[w] ? v : mx[w];
          });
        }
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) {
          // A lane with no allowed key so far keeps max kMasked; shifting by 0 keeps exp() at 0.
          shift[w] = mx[w] == kMasked ? T(0) : mx[w];
          alpha[w] = hk_exp(Mx(g * kLanes + w) - shift[w]);
          Mx(g * kLanes + w) = mx[w];
        });
        group_exp(m, jsteps, shift, alpha, p, &Sum(g * kLanes));
        group_pv(m, p, Vt, hd, jsteps, alpha, acc);
      });
    }

    // o = O / sum on valid rows (a row whose sum stayed 0 saw no key: zeros).
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, ngroups), [&](int g) {
      const T* acc = &O(size_t(g) * hd * kLanes);
      const int gi0 = i0 + g * kLanes;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kLanes), [&](int w) {
        const int i = gi0 + w;
        if (i >= v_end) return;
        const T l = Sum(g * kLanes + w);
        const T inv = l > T(0) ? T(1) / l : T(0);
        for (int c = 0; c < hd; ++c) o(row0 + i, qc + c) = acc[c * kLanes + w] * inv;
      });
    });
  }
};

template <class T, bool kBias>
void launch(const ConstMat<T>& qkv, const ConstVec<T>& bias, const Lengths& lengths, int B, int S, int H,
            bool causal, const Mat<T>& o) {
  const int D = int(o.extent(1)), hd = D / H;
  const int groups = groups_per_team(hd, S);
  const int qblocks = (S + groups * kLanes - 1) / (groups * kLanes);
  const size_t bytes = AttentionTeams<T, kBias>::scratch_bytes(hd, groups);
  const int level = scratch_level(bytes);
  AttentionTeams<T, kBias> f{qkv, bias, lengths, o, S, H, hd, D, groups, qblocks, level, causal,
                             T(1) / kmath::sqrt(T(hd))};
  const int vec = TeamPolicy::vector_length_max() < kLanes ? TeamPolicy::vector_length_max() : kLanes;
  TeamPolicy policy(B * H * qblocks, Kokkos::AUTO, vec);
  Kokkos::parallel_for("hk::attention[kokkos]", policy.set_scratch_size(level, Kokkos::PerTeam(bytes)), f);
}

}  // namespace

template <class T>
void attention(const ConstMat<T>& qkv, const ConstVec<T>& qkv_bias, const Lengths& lengths, int B, int S,
               int H, bool causal, const Mat<T>& o) {
  const size_t D = o.extent(1);
  if (B < 0 || S < 1 || H < 1 || D % size_t(H) != 0 || qkv.extent(0) != size_t(B) * S ||
      o.extent(0) != size_t(B) * S || qkv.extent(1) != 3 * D || lengths.extent(0) < size_t(B) ||
      (qkv_bias.extent(0) != 0 && qkv_bias.extent(0) != 3 * D))
    throw Error("hk::attention[kokkos]: shape mismatch");
  if (B == 0) return;
  if (qkv_bias.extent(0) != 0)
    launch<T, true>(qkv, qkv_bias, lengths, B, S, H, causal, o);
  else
    launch<T, false>(qkv, qkv_bias, lengths, B, S, H, causal, o);
}

template void attention<float>(const ConstMat<float>&, const ConstVec<float>&, const Lengths&, int, int, int,
                               bool, const Mat<float>&);
template void attention<double>(const ConstMat<double>&, const ConstVec<double>&, const Lengths&, int, int,
                                int, bool, const Mat<double>&);

}  // namespace hk::kokkos
