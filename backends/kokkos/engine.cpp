// The Kokkos backend: parameters and activations as Kokkos views, the forward pass as a plan
// over this file's kernel table (plan.hpp), and the backend's registration.
#include "kokkos/engine.hpp"

#include <KokkosKernels_config.h>

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "hk/error.hpp"
#include "hk/plan.hpp"
#include "kokkos/attention.hpp"
#include "kokkos/backend.hpp"
#include "kokkos/common.hpp"
#include "kokkos/layer_norm.hpp"
#include "kokkos/linear.hpp"
#include "kokkos/runtime.hpp"

namespace hk::kokkos {
namespace {

template <class T>
struct LayerParams {
  Vec<T> ln1_w, ln1_b;
  Mat<T> w_qkv;  // [3D, D]: q_proj, k_proj, v_proj weights stacked, one GEMM
  Vec<T> b_qkv;  // [3D]
  Mat<T> w_o;
  Vec<T> b_o;
  Vec<T> ln2_w, ln2_b;
  Mat<T> w_in;  // [F, D]
  Vec<T> b_in;
  Mat<T> w_out;  // [D, F]
  Vec<T> b_out;
};

template <class T>
struct Params {
  std::vector<LayerParams<T>> layers;
  Vec<T> final_w, final_b;
};

// Concatenation of `parts` (float64 on the host) as one view of T.
template <class T>
Vec<T> upload_vec(const std::string& label, std::initializer_list<const std::vector<double>*> parts) {
  size_t n = 0;
  for (const auto* p : parts) n += p->size();
  Vec<T> d(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n);
  auto h = Kokkos::create_mirror_view(d);
  size_t k = 0;
  for (const auto* p : parts)
    for (double v : *p) h(k++) = T(v);
  Kokkos::deep_copy(d, h);
  return d;
}

// Row-major [rows, cols] of T from the row-stacked float64 `parts`.
template <class T>
Mat<T> upload_mat(const std::string& label, size_t rows, size_t cols,
                  std::initializer_list<const std::vector<double>*> parts) {
  Mat<T> d(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), rows, cols);
  auto h = Kokkos::create_mirror_view(d);
  size_t k = 0;
  for (const auto* p : parts)
    for (double v : *p) {
      h(k / cols, k % cols) = T(v);
      ++k;
    }
  if (k != rows * cols) throw Error("kokkos backend: parameter " + label + " has the wrong size");
  Kokkos::deep_copy(d, h);
  return d;
}

template <class T>
Params<T> upload(const Model& m) {
  const size_t D = size_t(m.config.d_model), F = size_t(m.config.ffn_dim);
  Params<T> p;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& w = m.layers[l];
    const std::string n = "layers." + std::to_string(l) + ".";
    LayerParams<T> d;
    d.ln1_w = upload_vec<T>(n + "norm1.weight", {&w.norm1_w});
    d.ln1_b = upload_vec<T>(n + "norm1.bias", {&w.norm1_b});
    d.w_qkv = upload_mat<T>(n + "attn.qkv.weight", 3 * D, D, {&w.q_w, &w.k_w, &w.v_w});
    d.b_qkv = upload_vec<T>(n + "attn.qkv.bias", {&w.q_b, &w.k_b, &w.v_b});
    d.w_o = upload_mat<T>(n + "attn.out_proj.weight", D, D, {&w.o_w});
    d.b_o = upload_vec<T>(n + "attn.out_proj.bias", {&w.o_b});
    d.ln2_w = upload_vec<T>(n + "norm2.weight", {&w.norm2_w});
    d.ln2_b = upload_vec<T>(n + "norm2.bias", {&w.norm2_b});
    d.w_in = upload_mat<T>(n + "ffn_in.weight", F, D, {&w.ffn_in_w});
    d.b_in = upload_vec<T>(n + "ffn_in.bias", {&w.ffn_in_b});
    d.w_out = upload_mat<T>(n + "ffn_out.weight", D, F, {&w.ffn_out_w});
    d.b_out = upload_vec<T>(n + "ffn_out.bias", {&w.ffn_out_b});
    p.layers.push_back(d);
  }
  p.final_w = upload_vec<T>("final_norm.weight", {&m.final_norm_w});
  p.final_b = upload_vec<T>("final_norm.bias", {&m.final_norm_b});
  return p;
}

// What the kernels of one forward call see: the parameters and the buffers of plan.hpp,
// each a view of exactly B*S rows.
template <class T>
struct Ctx {
  const Params<T>* params;
  const ModelConfig* config;
  int B, S;
  Mat<T> x, h, qkv, o, f, y;
  Lengths lengths;
  const LayerParams<T>& layer(int l) const { return params->layers[size_t(l)]; }
};

// Names a plan entry for profilers (Kokkos Tools regions around its launches).
class Region {
 public:
  explicit Region(const std::string& name) { Kokkos::Profiling::pushRegion(name); }
  ~Region() { Kokkos::Profiling::popRegion(); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
};

template <class T>
Kernel<Ctx<T>> single(const std::string& name, StepKind kind, std::function<void(Ctx<T>&, const Step&)> run) {
  return single_step_kernel<Ctx<T>>(name, kind, [name, run](Ctx<T>& c, const Step& s) {
    Region r(name);
    run(c, s);
  });
}

template <class T>
Kernel<Ctx<T>> chain(const std::string& name, std::function<int(const std::vector<Step>&, size_t)> match,
                     std::function<void(Ctx<T>&, const Step*)> run) {
  Kernel<Ctx<T>> k;
  k.name = name;
  k.covers = [match](const std::vector<Step>& steps, size_t at, const Shape&) { return match(steps, at); };
  k.run = [name, run](Ctx<T>& c, const Step* first, int) {
    Region r(name);
    run(c, first);
  };
  return k;
}

// Every kernel covers every shape and precision of this backend, so the table is the same
// for all B; fused chains come first and win where they match.
template <class T>
std::vector<Kernel<Ctx<T>>> kernel_table(bool fuse) {
  using SK = StepKind;
  std::vector<Kernel<Ctx<T>>> t;
  if (fuse) {
    // The QKV GEMM leaves out its bias; attention adds it while staging Q and the K/V tiles.
    t.push_back(chain<T>(
        "hk::qkv_attention[kokkos]",
        [](const std::vector<Step>& s, size_t at) { return match_chain(s, at, {SK::qkv_proj, SK::attention}); },
        [](Ctx<T>& c, const Step* st) {
          const auto& L = c.layer(st->layer);
          gemm_nt<T>(c.h, L.w_qkv, T(0), c.qkv);
          attention<T>(c.qkv, L.b_qkv, c.lengths, c.B, c.S, c.config->n_heads, c.config->causal, c.o);
        }));
    // Residual projections accumulate into x; the next LayerNorm adds their bias on its way.
    t.push_back(chain<T>(
        "hk::linear_add_layer_norm[kokkos]",
        [](const std::vector<Step>& s, size_t at) { return match_chain(s, at, {SK::out_proj, SK::ln2}); },
        [](Ctx<T>& c, const Step* st) {
          const auto& L = c.layer(st->layer);
          gemm_nt<T>(c.o, L.w_o, T(1), c.x);
          add_layer_norm<T>(c.x, L.b_o, L.ln2_w, L.ln2_b, c.config->eps, c.h);
        }));
    t.push_back(chain<T>(
        "hk::linear_add_layer_norm[kokkos]",
        [](const std::vector<Step>& s, size_t at) { return match_chain(s, at, {SK::ffn_out, SK::ln1}); },
        [](Ctx<T>& c, const Step* st) {
          const auto& L = c.layer(st[0].layer);
          const auto& next = c.layer(st[1].layer);
          gemm_nt<T>(c.f, L.w_out, T(1), c.x);
          add_layer_norm<T>(c.x, L.b_out, next.ln1_w, next.ln1_b, c.config->eps, c.h);
        }));
    t.push_back(chain<T>(
        "hk::linear_final_layer_norm[kokkos]",
        [](const std::vector<Step>& s, size_t at) { return match_chain(s, at, {SK::ffn_out, SK::final_ln}); },
        [](Ctx<T>& c, const Step* st) {
          const auto& L = c.layer(st->layer);
          gemm_nt<T>(c.f, L.w_out, T(1), c.x);
          final_layer_norm<T>(c.x, L.b_out, c.params->final_w, c.params->final_b, c.config->eps, c.lengths, c.S,
                              c.y);
        }));
  }
  t.push_back(single<T>("hk::layer_norm[kokkos]", SK::ln1, [](Ctx<T>& c, const Step& s) {
    const auto& L = c.layer(s.layer);
    layer_norm<T>(c.x, L.ln1_w, L.ln1_b, c.config->eps, c.h);
  }));
  t.push_back(single<T>("hk::linear[kokkos]", SK::qkv_proj, [](Ctx<T>& c, const Step& s) {
    const auto& L = c.layer(s.layer);
    gemm_nt<T>(c.h, L.w_qkv, T(0), c.qkv);
    add_bias<T>(c.qkv, L.b_qkv);
  }));
  t.push_back(single<T>("hk::attention[kokkos]", SK::attention, [](Ctx<T>& c, const Step&) {
    attention<T>(c.qkv, ConstVec<T>(), c.lengths, c.B, c.S, c.config->n_heads, c.config->causal, c.o);
  }));
  t.push_back(single<T>("hk::linear_residual[kokkos]", SK::out_proj, [](Ctx<T>& c, const Step& s) {
    const auto& L = c.layer(s.layer);
    gemm_nt<T>(c.o, L.w_o, T(1), c.x);
    add_bias<T>(c.x, L.b_o);
  }));
  t.push_back(single<T>("hk::layer_norm[kokkos]", SK::ln2, [](Ctx<T>& c, const Step& s) {
    const auto& L = c.layer(s.layer);
    layer_norm<T>(c.x, L.ln2_w, L.ln2_b, c.config->eps, c.h);
  }));
  t.push_back(single<T>("hk::linear_gelu[kokkos]", SK::ffn_in, [](Ctx<T>& c, const Step& s) {
    const auto& L = c.layer(s.layer);
    gemm_nt<T>(c.h, L.w_in, T(0), c.f);
    bias_gelu<T>(c.f, L.b_in);
  }));
  t.push_back(single<T>("hk::linear_residual[kokkos]", SK::ffn_out, [](Ctx<T>& c, const Step& s) {
    const auto& L = c.layer(s.layer);
    gemm_nt<T>(c.f, L.w_out, T(1), c.x);
    add_bias<T>(c.x, L.b_out);
  }));
  t.push_back(single<T>("hk::final_layer_norm[kokkos]", SK::final_ln, [](Ctx<T>& c, const Step&) {
    final_layer_norm<T>(c.x, ConstVec<T>(), c.params->final_w, c.params->final_b, c.config->eps, c.lengths, c.S,
                        c.y);
  }));
  return t;
}

template <class T>
Mat<T> rows_of(const Mat<T>& m, size_t rows) {
  return Kokkos::subview(m, Kokkos::make_pair(size_t(0), rows), Kokkos::ALL);
}

template <class T>
class EngineImpl final : public KokkosEngine {
 public:
  EngineImpl(const Model& model, const EngineOptions& opt, const EngineTuning& tuning)
      : config_(model.config),
        precision_(opt.precision),
        max_batch_(opt.max_batch),
        seq_len_(opt.seq_len),
        params_(upload<T>(model)),
        steps_(forward_steps(model.config.n_layers)),
        table_(kernel_table<T>(tuning.fuse)) {
    const size_t rows = size_t(max_batch_) * size_t(seq_len_), D = size_t(config_.d_model);
    auto alloc = [&](const char* label, size_t cols) {
      return Mat<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("hk::kokkos::") + label), rows, cols);
    };
    x_ = alloc("x", D);
    h_ = alloc("h", D);
    qkv_ = alloc("qkv", 3 * D);
    o_ = alloc("o", D);
    f_ = alloc("f", size_t(config_.ffn_dim));
    lengths_ = Kokkos::View<int32_t*, MemSpace>("hk::kokkos::lengths", size_t(max_batch_));
  }

  std::string backend() const override { return "kokkos"; }

  std::string device() const override {
    std::string d = std::string("host: ") + runtime_description() + ", GEMMs through Kokkos Kernels";
#ifdef KOKKOSKERNELS_ENABLE_TPL_BLAS
    d += " (BLAS TPL)";
#endif
    if (std::is_same_v<T, double>)
      d += "; float64 throughout (precision reference)";
    else
      d += "; float32 throughout: this backend has no reduced-precision arithmetic, precision fast runs as fp32";
    return d;
  }

  Precision precision() const override { return precision_; }

  void forward(const float* x, const int32_t* lengths, int B, float* y) override { run(x, lengths, B, y); }
  void forward_f64(const float* x, const int32_t* lengths, int B, double* y) override { run(x, lengths, B, y); }

  std::string explain(int B) const override {
    check_batch(B);
    return describe_plan(make_plan(steps_, table_, shape(B)), steps_);
  }

 private:
  Shape shape(int B) const { return Shape{B, seq_len_, config_, precision_}; }

  void check_batch(int B) const {
    if (B < 1 || B > max_batch_)
      throw Error("kokkos forward: batch " + std::to_string(B) + " outside 1.." + std::to_string(max_batch_) +
                  " (max_batch of this engine)");
  }

  const std::vector<PlannedKernel<Ctx<T>>>& plan(int B) {
    auto it = plans_.find(B);
    if (it == plans_.end()) it = plans_.emplace(B, make_plan(steps_, table_, shape(B))).first;
    return it->second;
  }

  template <class Y>
  void run(const float* x, const int32_t* lengths, int B, Y* y) {
    check_batch(B);
    if (!x || !y) throw Error("kokkos forward: x and y must not be null");
    const int S = seq_len_, D = config_.d_model;
    const size_t rows = size_t(B) * size_t(S);

    auto len_h = Kokkos::create_mirror_view(lengths_);
    for (int b = 0; b < B; ++b) {
      const int32_t l = lengths ? lengths[b] : S;
      if (l < 0 || l > S)
        throw Error("kokkos forward: lengths[" + std::to_string(b) + "] = " + std::to_string(l) + " outside 0.." +
                    std::to_string(S));
      len_h(b) = l;
    }
    Kokkos::deep_copy(lengths_, len_h);

    const Mat<T> xs = rows_of(x_, rows);
    if constexpr (std::is_same_v<T, float>) {
      Kokkos::deep_copy(xs, HostMat<const float>(x, rows, size_t(D)));
    } else {
      auto xm = Kokkos::create_mirror_view(xs);
      for (size_t r = 0; r < rows; ++r)
        for (int c = 0; c < D; ++c) xm(r, c) = T(x[r * D + c]);
      Kokkos::deep_copy(xs, xm);
    }

    Ctx<T> ctx{&params_, &config_, B, S, xs, rows_of(h_, rows), rows_of(qkv_, rows), rows_of(o_, rows),
               rows_of(f_, rows), Mat<T>(), lengths_};
    constexpr bool direct =
        std::is_same_v<Y, T> && Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;
    if constexpr (direct) {
      ctx.y = Mat<T>(y, rows, size_t(D));  // the final LayerNorm writes the caller's array
    } else {
      if (y_.extent(0) == 0)
        y_ = Mat<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "hk::kokkos::y"),
                    size_t(max_batch_) * size_t(S), size_t(D));
      ctx.y = rows_of(y_, rows);
    }
    run_plan(plan(B), steps_, ctx);
    Kokkos::fence();
    if constexpr (!direct) {
      auto ym = Kokkos::create_mirror_view(ctx.y);
      Kokkos::deep_copy(ym, ctx.y);
      for (size_t r = 0; r < rows; ++r)
        for (int c = 0; c < D; ++c) y[r * D + c] = Y(ym(r, c));
    }
  }

  template <class V>
  using HostMat = Kokkos::View<V**, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  RuntimeRef runtime_;  // declared first, destroyed last: Kokkos outlives every view below
  ModelConfig config_;
  Precision precision_;
  int max_batch_, seq_len_;
  Params<T> params_;
  Mat<T> x_, h_, qkv_, o_, f_, y_;
  Kokkos::View<int32_t*, MemSpace> lengths_;
  std::vector<Step> steps_;
  std::vector<Kernel<Ctx<T>>> table_;
  std::map<int, std::vector<PlannedKernel<Ctx<T>>>> plans_;
};

void check_model(const Model& model) {
  model.config.validate("kokkos backend model");
  if (model.layers.size() != size_t(model.config.n_layers))
    throw Error("kokkos backend: the model has " + std::to_string(model.layers.size()) + " layers, its config " +
                std::to_string(model.config.n_layers));
  // parameters() only hands out pointers to the vectors; nothing is modified here.
  for (const ParameterRef& p : const_cast<Model&>(model).parameters()) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    if (int64_t(p.values->size()) != n)
      throw Error("kokkos backend: parameter " + p.name + " has " + std::to_string(p.values->size()) +
                  " values, expected " + std::to_string(n));
  }
}

class KokkosBackend final : public Backend {
 public:
  std::string name() const override { return "kokkos"; }
  std::string unavailable_reason() const override { return ""; }
  std::unique_ptr<Engine> create(const Model& model, const EngineOptions& options) const override {
    return create_engine(model, options);
  }
};

}  // namespace

std::unique_ptr<KokkosEngine> create_engine(const Model& model, const EngineOptions& options,
                                            const EngineTuning& tuning) {
  check_model(model);
  if (options.max_batch < 1) throw Error("max_batch must be at least 1");
  if (options.seq_len < 1) throw Error("seq_len must be at least 1");
  const int64_t widest = std::max<int64_t>(3 * int64_t(model.config.d_model), model.config.ffn_dim);
  if (int64_t(options.max_batch) * options.seq_len > std::numeric_limits<int32_t>::max() / widest)
    throw Error("kokkos backend: max_batch * seq_len too large (a buffer would exceed 2^31 elements)");
  if (options.precision == Precision::reference)
    return std::make_unique<EngineImpl<double>>(model, options, tuning);
  return std::make_unique<EngineImpl<float>>(model, options, tuning);
}

const Backend& backend() {
  static const KokkosBackend b;
  return b;
}

}  // namespace hk::kokkos
