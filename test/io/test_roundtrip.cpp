// Writers and readers agree: models in every weight dtype, inputs in float32/float16 with and
// without lengths, chunked reads equal to one read; the float16 conversion is exact and rounds
// to nearest even.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "h5_test_util.hpp"

namespace hk::test {
namespace {

// ---- float16 conversion (exhaustive) --------------------------------------------------------

TEST(Half, EveryBitPatternRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double v = io::half_to_double(uint16_t(h));
    const bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
    if (nan) {
      ASSERT_TRUE(std::isnan(v)) << h;
      ASSERT_EQ(io::double_to_half(v) & 0x7e00, 0x7e00) << h;
    } else {
      ASSERT_EQ(io::double_to_half(v), h) << "bits " << h << " value " << v;
    }
  }
}

TEST(Half, MidpointsRoundToEvenAndNeighboursToNearest) {
  // Every pair of adjacent positive finite halves, including subnormal -> normal and the top.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const double lo = io::half_to_double(uint16_t(h)), hi = io::half_to_double(uint16_t(h + 1));
    const double mid = 0.5 * (lo + hi);
    const uint16_t even = (h % 2 == 0) ? uint16_t(h) : uint16_t(h + 1);
    ASSERT_EQ(io::double_to_half(mid), even) << h;
    ASSERT_EQ(io::double_to_half(-mid), uint16_t(even | 0x8000)) << h;
    const double eps = (hi - lo) * 1e-3;
    ASSERT_EQ(io::double_to_half(mid - eps), h) << h;
    ASSERT_EQ(io::double_to_half(mid + eps), h + 1) << h;
  }
}

TEST(Half, OverflowAndSpecials) {
  EXPECT_EQ(io::double_to_half(65504.0), 0x7bff);
  EXPECT_EQ(io::double_to_half(65519.99), 0x7bff);
  EXPECT_EQ(io::double_to_half(65520.0), 0x7c00);  // the tie rounds to even: up to Inf
  EXPECT_EQ(io::double_to_half(1e300), 0x7c00);
  EXPECT_EQ(io::double_to_half(-1e300), 0xfc00);
  EXPECT_EQ(io::double_to_half(std::numeric_limits<double>::infinity()), 0x7c00);
  EXPECT_EQ(io::double_to_half(-0.0), 0x8000);
  EXPECT_EQ(io::double_to_half(1e-30), 0x0000);        // underflow to zero
  EXPECT_EQ(io::double_to_half(0x1.0p-25), 0x0000);    // half the smallest subnormal: ties to even (0)
  EXPECT_EQ(io::double_to_half(0x1.8p-25), 0x0001);
  EXPECT_EQ(io::half_to_double(0x3c00), 1.0);
  EXPECT_EQ(io::half_to_double(0x0001), 0x1.0p-24);
}

// ---- models --------------------------------------------------------------------------------

double as_stored(double v, io::DType t) {
  switch (t) {
    case io::DType::float16: return io::half_to_double(io::double_to_half(v));
    case io::DType::float32: return double(float(v));
    case io::DType::float64: return v;
  }
  return v;
}

class ModelRoundTrip : public ::testing::TestWithParam<io::DType> {};

TEST_P(ModelRoundTrip, EveryParameterAsStored) {
  ScratchDir dir;
  const std::string f = dir.path("m.h5");
  ModelConfig c = small_config(/*causal=*/false);
  c.eps = 3e-6;
  Model m = synthetic_model(c, 42, /*nontrivial_ln=*/true);
  io::ModelWriteOptions o;
  o.dtype = GetParam();
  io::write_model(f, m, o);
  Model back = io::read_model(f);
  EXPECT_EQ(back.config.d_model, c.d_model);
  EXPECT_EQ(back.config.n_heads, c.n_heads);
  EXPECT_EQ(back.config.n_layers, c.n_layers);
  EXPECT_EQ(back.config.ffn_dim, c.ffn_dim);
  EXPECT_EQ(back.config.causal, c.causal);
  EXPECT_EQ(back.config.eps, c.eps);
  auto a = m.parameters(), b = back.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].name, b[i].name);
    ASSERT_EQ(a[i].values->size(), b[i].values->size()) << a[i].name;
    for (size_t k = 0; k < a[i].values->size(); ++k)
      ASSERT_EQ(as_stored((*a[i].values)[k], GetParam()), (*b[i].values)[k]) << a[i].name << "[" << k << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, ModelRoundTrip,
                         ::testing::Values(io::DType::float16, io::DType::float32, io::DType::float64),
                         [](const auto& info) { return std::string(io::to_string(info.param)); });

TEST(ModelWrite, WithoutEpsReadsTheDefault) {
  ScratchDir dir;
  const std::string f = dir.path("m.h5");
  ModelConfig c = small_config();
  c.eps = 1e-3;
  io::ModelWriteOptions o;
  o.write_eps = false;
  io::write_model(f, synthetic_model(c, 1), o);
  EXPECT_EQ(io::read_model(f).config.eps, 1e-5);
}

TEST(ModelWrite, RefusesASecondModelInTheSameFile) {
  ScratchDir dir;
  const std::string f = dir.path("m.h5");
  io::write_model(f, synthetic_model(small_config(), 1));
  HK_EXPECT_FILE_ERROR(error_of([&] { io::write_model(f, synthetic_model(small_config(), 1), {}, io::WriteMode::append); }),
                       f, "/model", "found a group");
}

TEST(ModelWrite, SameSeedSameBytes) {
  ScratchDir dir;
  write_good_file(dir.path("a.h5"));
  write_good_file(dir.path("b.h5"));
  EXPECT_EQ(read_bytes(dir.path("a.h5")), read_bytes(dir.path("b.h5")));
}

// ---- inputs ----------------------------------------------------------------------------------

struct InputCase {
  io::DType x_type;
  bool lengths;
};

class InputRoundTrip : public ::testing::TestWithParam<InputCase> {};

TEST_P(InputRoundTrip, ChunkedReadsEqualOneRead) {
  ScratchDir dir;
  const std::string f = dir.path("in.h5");
  const int B = 11, S = 7, D = 6;
  const std::vector<float> x = synthetic_input(B, S, D, 5);
  std::vector<int32_t> len = synthetic_lengths(B, S, 5);
  len[0] = 0;
  len[1] = S;
  io::write_input(f, B, S, D, x.data(), GetParam().lengths ? len.data() : nullptr, GetParam().x_type);

  io::InputFile in(f);
  EXPECT_EQ(in.batch(), B);
  EXPECT_EQ(in.seq_len(), S);
  EXPECT_EQ(in.d_model(), D);
  EXPECT_EQ(in.has_lengths(), GetParam().lengths);
  EXPECT_EQ(in.x_type(), GetParam().x_type);

  std::vector<float> all(size_t(B) * S * D);
  std::vector<int32_t> all_len(B);
  in.read(0, B, all.data(), all_len.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const float expect = GetParam().x_type == io::DType::float16 ? float(io::half_to_double(io::double_to_half(x[i]))) : x[i];
    ASSERT_EQ(all[i], expect) << i;
  }
  EXPECT_EQ(all_len, GetParam().lengths ? len : std::vector<int32_t>(B, S));

  for (int chunk : {1, 3, 4, 10}) {
    std::vector<float> part(size_t(chunk) * S * D);
    std::vector<int32_t> part_len(chunk);
    for (int b0 = 0; b0 < B; b0 += chunk) {
      const int nb = std::min(chunk, B - b0);
      in.read(b0, nb, part.data(), part_len.data());
      for (size_t i = 0; i < size_t(nb) * S * D; ++i) ASSERT_EQ(part[i], all[size_t(b0) * S * D + i]) << chunk;
      for (int i = 0; i < nb; ++i) ASSERT_EQ(part_len[size_t(i)], all_len[size_t(b0 + i)]);
    }
  }
  in.read(B, 0, nullptr, nullptr);  // an empty slice is allowed
}

INSTANTIATE_TEST_SUITE_P(Types, InputRoundTrip,
                         ::testing::Values(InputCase{io::DType::float32, true}, InputCase{io::DType::float32, false},
                                           InputCase{io::DType::float16, true}, InputCase{io::DType::float16, false}),
                         [](const auto& info) {
                           return std::string(io::to_string(info.param.x_type)) +
                                  (info.param.lengths ? "_lengths" : "_no_lengths");
                         });

TEST(InputWrite, RefusesBadArguments) {
  ScratchDir dir;
  const std::string f = dir.path("in.h5");
  std::vector<float> x(2 * 3 * 4, 0.f);
  const int32_t bad[2] = {1, 4};
  HK_EXPECT_FILE_ERROR(error_of([&] { io::write_input(f, 2, 3, 4, x.data(), bad); }), f, "/input/lengths", "found 4 at [1]");
  HK_EXPECT_FILE_ERROR(error_of([&] { io::write_input(f, 2, 3, 4, x.data(), nullptr, io::DType::float64); }), f,
                       "/input/x", "not float64");
}

TEST(InputFile, ModelAndInputInOneFile) {
  ScratchDir dir;
  const std::string f = dir.path("both.h5");
  write_good_file(f);
  const Model m = io::read_model(f);
  io::InputFile in(f, m.config);  // the same file open twice at once
  const Model again = io::read_model(f);
  EXPECT_EQ(again.parameter_count(), m.parameter_count());
  std::vector<float> x(size_t(kB) * kS * 8);
  std::vector<int32_t> len(kB);
  in.read(0, kB, x.data(), len.data());
  EXPECT_EQ(len, (std::vector<int32_t>{2, 0, 5}));
}

TEST(InputFile, ReadsFromAnotherThread) {
  // hk_forward prefetches the next chunk on a second thread; the io lock serialises HDF5.
  ScratchDir dir;
  const std::string f = dir.path("both.h5");
  write_good_file(f);
  io::InputFile in(f);
  std::vector<float> a(size_t(kS) * 8), b(size_t(kS) * 8);
  std::thread t([&] {
    for (int i = 0; i < 200; ++i) in.read(i % kB, 1, a.data(), nullptr);
  });
  for (int i = 0; i < 200; ++i) io::read_model(f);
  t.join();
  in.read(0, 1, b.data(), nullptr);
  EXPECT_EQ(io::read_model(f).config.d_model, 8);
}

// probe(): the child's walk of x's storage. Chunked without filters and contiguous: every slice
// walks (true), NaNs are not its business (values are not read); with the deflate filter it does
// nothing (false: reading is the only check); slices outside the batch are refused.
TEST(InputFile, ProbeWalksUnfilteredStorageOnly) {
  ScratchDir dir;
  const int B = 37, S = 5, D = 8;
  std::vector<float> x(size_t(B) * S * D);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 97) * 0.25f;
  x[size_t(20) * S * D + 3] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<int32_t> len(size_t(B), S);
  const std::string chunked = dir.path("chunked.h5");
  io::write_input(chunked, B, S, D, x.data(), len.data());
  {
    io::InputFile in(chunked);
    for (int64_t b0 = 0; b0 < B; b0 += 7) EXPECT_TRUE(in.probe(b0, std::min<int64_t>(7, B - b0))) << b0;
    EXPECT_TRUE(in.probe(0, B));
    EXPECT_TRUE(in.probe(B, 0));
    EXPECT_THROW(in.probe(B - 2, 3), Error);
    EXPECT_THROW(in.probe(-1, 1), Error);
    std::vector<float> buf(size_t(B) * S * D);
    EXPECT_THROW(in.read(0, B, buf.data(), nullptr), Error);  // the NaN probe() walked past
  }
  // The same values, contiguous.
  const std::string contiguous = dir.path("contiguous.h5");
  io::write_input(contiguous, B, S, D, x.data(), len.data());
  {
    std::vector<double> v(x.begin(), x.end());
    replace_dataset(contiguous, "/input/x", H5T_IEEE_F32LE, {hsize_t(B), hsize_t(S), hsize_t(D)}, v);
    io::InputFile in(contiguous);
    EXPECT_TRUE(in.probe(3, 30));
    EXPECT_TRUE(in.probe(0, B));
  }
  // Deflate: not walked.
  const std::string deflated = dir.path("deflate.h5");
  io::write_input(deflated, B, S, D, x.data(), len.data());
  deflate_x(deflated, 4);
  {
    io::InputFile in(deflated);
    EXPECT_FALSE(in.probe(0, 8));
    EXPECT_FALSE(in.probe(8, 8));
  }
}

// read() on every storage of x gives the values written: the raw path (float32 in the host's
// byte order, contiguous or chunked in whole rows, read with pread past HDF5) and HDF5's (chunks
// that split a row, big-endian, float16, unwritten chunks that read as the fill value), for
// slices that start and end inside chunks, single rows and the whole batch.
TEST(InputFile, EveryStorageOfXReadsTheSameValues) {
  ScratchDir dir;
  const int B = 37, S = 5, D = 8;
  const hsize_t dims[3] = {hsize_t(B), hsize_t(S), hsize_t(D)};
  std::vector<float> x(size_t(B) * S * D);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 1013) - 500) * 0.125f;  // exact in float16 too
  const std::vector<int32_t> len(size_t(B), S);
  const std::vector<double> v(x.begin(), x.end());
  struct Storage {
    const char* what;
    hid_t type;
    std::vector<hsize_t> chunk;
  };
  const std::vector<Storage> storages = {
      {"contiguous", H5T_IEEE_F32LE, {}},
      {"chunks of 4 whole rows", H5T_IEEE_F32LE, {4, dims[1], dims[2]}},
      {"chunks of 1 row", H5T_IEEE_F32LE, {1, dims[1], dims[2]}},
      {"chunks splitting rows", H5T_IEEE_F32LE, {4, dims[1], 4}},
      {"big-endian chunks of whole rows", H5T_IEEE_F32BE, {4, dims[1], dims[2]}},
      {"big-endian contiguous", H5T_IEEE_F32BE, {}},
      {"float16 (default chunks)", H5T_IEEE_F32LE, {}},
  };
  for (const Storage& st : storages) {
    SCOPED_TRACE(st.what);
    const std::string path = dir.path(std::string(st.what) + ".h5");
    const bool half = std::string(st.what).rfind("float16", 0) == 0;
    io::write_input(path, B, S, D, x.data(), len.data(), half ? io::DType::float16 : io::DType::float32);
    if (!half) replace_dataset(path, "/input/x", st.type, {dims[0], dims[1], dims[2]}, v, st.chunk);
    io::InputFile in(path);
    for (const auto& [b0, nb] : std::vector<std::pair<int64_t, int64_t>>{{0, B}, {0, 1}, {3, 6}, {5, 30}, {36, 1}, {8, 4}}) {
      std::vector<float> got(size_t(nb) * S * D, -99.0f);
      std::vector<int32_t> got_len(size_t(nb), -1);
      in.read(b0, nb, got.data(), got_len.data());
      for (int64_t i = 0; i < nb * S * D; ++i)
        ASSERT_EQ(got[size_t(i)], x[size_t(b0 * S * D + i)]) << "slice [" << b0 << ", " << b0 + nb << ") element " << i;
      for (int64_t k = 0; k < nb; ++k) EXPECT_EQ(got_len[size_t(k)], S);
    }
  }
  // Chunks of whole rows, some never written: those read as the fill value (0).
  const std::string sparse = dir.path("sparse.h5");
  io::write_input(sparse, B, S, D, x.data(), len.data());
  replace_dataset(sparse, "/input/x", H5T_IEEE_F32LE, {dims[0], dims[1], dims[2]}, {}, {4, dims[1], dims[2]});
  poke_float(sparse, "/input/x", hsize_t(9) * S * D + 7, 2.5f);  // allocates the chunk of rows 8..11 only
  io::InputFile in(sparse);
  std::vector<float> got(size_t(B) * S * D, -99.0f);
  in.read(0, B, got.data(), nullptr);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], i == size_t(9) * S * D + 7 ? 2.5f : 0.0f) << i;
  std::vector<float> four(size_t(4) * S * D, -99.0f);  // the one written chunk alone
  in.read(8, 4, four.data(), nullptr);
  for (size_t i = 0; i < four.size(); ++i) ASSERT_EQ(four[i], i == size_t(1) * S * D + 7 ? 2.5f : 0.0f) << i;
}

// A file with a user block (512 bytes before the HDF5 data: every address shifted), x chunked in
// whole rows, contiguous, and contiguous but never written (the fill value): the values written.
TEST(InputFile, AUserBlockShiftsNothing) {
  ScratchDir dir;
  const int B = 11, S = 3, D = 4;
  const hsize_t dims[3] = {hsize_t(B), hsize_t(S), hsize_t(D)};
  std::vector<float> x(size_t(B) * S * D);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) + 0.5f;
  const std::vector<double> v(x.begin(), x.end());
  const std::vector<int32_t> len(size_t(B), S);
  for (const int layout : {0, 1, 2}) {  // chunks of 2 whole rows, contiguous, contiguous unwritten
    SCOPED_TRACE(layout);
    const std::string path = dir.path("ub" + std::to_string(layout) + ".h5");
    {
      const hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
      ASSERT_GE(H5Pset_userblock(fcpl, 512), 0);
      const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
      ASSERT_GE(f, 0);
      H5Fclose(f);
      H5Pclose(fcpl);
    }
    io::write_input(path, B, S, D, x.data(), len.data(), io::DType::float32, io::WriteMode::append);
    const std::vector<hsize_t> chunk = layout == 0 ? std::vector<hsize_t>{2, dims[1], dims[2]} : std::vector<hsize_t>{};
    replace_dataset(path, "/input/x", H5T_IEEE_F32LE, {dims[0], dims[1], dims[2]},
                    layout == 2 ? std::vector<double>{} : v, chunk);
    io::InputFile in(path);
    std::vector<float> got(size_t(5) * S * D, -99.0f);
    in.read(3, 5, got.data(), nullptr);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], layout == 2 ? 0.0f : x[size_t(3) * S * D + i]) << i;
  }
}

// A slice large enough to be read and checked in parts on several threads: the error names the
// first NaN/Inf of the slice, whichever part holds it, on the raw path (contiguous, chunks of
// whole rows) and HDF5's; without one every element arrives.
TEST(InputFile, ALargeSliceNamesItsFirstNonFiniteValue) {
  ScratchDir dir;
  const int B = 300, S = 128, D = 128;  // 4.9M elements: four parts
  std::vector<float> x(size_t(B) * S * D);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 4093) * 0.5f;
  const std::vector<int32_t> len(size_t(B), S);
  const std::vector<double> v(x.begin(), x.end());
  const hsize_t rows = 7;
  for (const int layout : {0, 1, 2}) {  // contiguous, chunks of 7 whole rows, chunks splitting rows
    SCOPED_TRACE(layout);
    const std::string path = dir.path("big" + std::to_string(layout) + ".h5");
    io::write_input(path, B, S, D, x.data(), len.data());
    const std::vector<hsize_t> chunk = layout == 0   ? std::vector<hsize_t>{}
                                       : layout == 1 ? std::vector<hsize_t>{rows, hsize_t(S), hsize_t(D)}
                                                     : std::vector<hsize_t>{rows, hsize_t(S), hsize_t(D / 2)};
    replace_dataset(path, "/input/x", H5T_IEEE_F32LE, {hsize_t(B), hsize_t(S), hsize_t(D)}, v, chunk);
    {
      io::InputFile in(path);
      std::vector<float> got(x.size(), -1.0f);
      in.read(0, B, got.data(), nullptr);
      EXPECT_EQ(std::memcmp(got.data(), x.data(), x.size() * sizeof(float)), 0);
    }
    // Two non-finite values in different parts: the earlier one is named.
    poke_float(path, "/input/x", hsize_t(250) * S * D + 3 * D + 1, std::numeric_limits<float>::quiet_NaN());
    poke_float(path, "/input/x", hsize_t(160) * S * D + 2 * D + 5, -std::numeric_limits<float>::infinity());
    io::InputFile in(path);
    std::vector<float> got(x.size());
    const std::string err = error_of([&] { in.read(0, B, got.data(), nullptr); });
    EXPECT_NE(err.find("-Inf at [160, 2, 5]"), std::string::npos) << err;
    const std::string later = error_of([&] { in.read(200, 100, got.data(), nullptr); });
    EXPECT_NE(later.find("NaN at [250, 3, 1]"), std::string::npos) << later;
  }
}

}  // namespace
}  // namespace hk::test
