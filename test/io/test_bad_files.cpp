// Every bad-file class of FORMAT.md gets a one-line hk::Error "<file>: <object>: <expected, found>".
// Each test starts from a good file and breaks exactly one thing with the HDF5 C API.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "h5_test_util.hpp"

namespace hk::test {
namespace {

class BadFile : public ::testing::Test {
 protected:
  void SetUp() override { write_good_file(file); }
  std::string model_error() {
    return error_of([&] { io::read_model(file); });
  }
  std::string input_error() {
    const Model m = io::read_model(file);
    return error_of([&] { io::InputFile in(file, m.config); });
  }
  ScratchDir dir;
  std::string file = dir.path("bad.h5");
};

TEST_F(BadFile, TheGoodFileReads) {
  const Model m = io::read_model(file);
  EXPECT_EQ(m.config.d_model, 8);
  io::InputFile in(file, m.config);
  EXPECT_EQ(in.batch(), kB);
}

// ---- the file itself ------------------------------------------------------------------------

TEST_F(BadFile, MissingFile) {
  const std::string f = dir.path("nope.h5");
  HK_EXPECT_FILE_ERROR(error_of([&] { io::read_model(f); }), f, "/", "No such file");
  HK_EXPECT_FILE_ERROR(error_of([&] { io::InputFile in(f); }), f, "/", "found none");
}

TEST_F(BadFile, NotHdf5AtAll) {
  const std::string f = dir.path("text.h5");
  write_text_file(f, "case,B,S\n1,2,3\n");
  HK_EXPECT_FILE_ERROR(error_of([&] { io::read_model(f); }), f, "/", "without the HDF5 signature");
}

TEST_F(BadFile, EmptyFile) {
  const std::string f = dir.path("empty.h5");
  write_text_file(f, "");
  HK_EXPECT_FILE_ERROR(error_of([&] { io::read_model(f); }), f, "/", "0-byte file");
}

TEST_F(BadFile, Directory) {
  HK_EXPECT_FILE_ERROR(error_of([&] { io::read_model(dir.dir().string()); }), dir.dir().string(), "/",
                       "found a directory");
}

TEST_F(BadFile, TruncatedFile) {
  // Cut at several places: inside the superblock's tail, in the metadata, in the data.
  const auto size = std::filesystem::file_size(file);
  for (const double frac : {0.05, 0.3, 0.5, 0.9, 0.99}) {
    const std::string f = dir.path("trunc.h5");
    std::filesystem::copy_file(file, f, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(f, uintmax_t(double(size) * frac));
    const std::string msg = error_of([&] {
      const Model m = io::read_model(f);
      io::InputFile in(f, m.config);
      std::vector<float> x(size_t(kB) * kS * m.config.d_model);
      std::vector<int32_t> len(kB);
      in.read(0, kB, x.data(), len.data());
    });
    SCOPED_TRACE("truncated to " + std::to_string(frac));
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind(f + ": ", 0), 0u) << msg;
  }
}

// ---- /model: group and attributes ----------------------------------------------------------

TEST_F(BadFile, MissingModelGroup) {
  remove_link(file, "/model");
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "expected a group, found no such object");
}

TEST_F(BadFile, ModelIsADataset) {
  remove_link(file, "/model");
  replace_dataset(file, "/model", H5T_IEEE_F32LE, {4}, {1, 2, 3, 4});
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "expected a group, found a dataset");
}

class MissingAttribute : public BadFile, public ::testing::WithParamInterface<const char*> {};

TEST_P(MissingAttribute, Named) {
  remove_attribute(file, "/model", GetParam());
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model",
                       std::string("attribute '") + GetParam() + "': expected");
  EXPECT_NE(model_error().find("missing attribute"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(EveryRequired, MissingAttribute,
                         ::testing::Values("format", "format_version", "d_model", "n_heads", "n_layers", "ffn_dim",
                                           "causal"));

TEST_F(BadFile, WrongFormatString) {
  set_string_attribute(file, "/model", "format", "hk-mlp");
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "expected \"hk-transformer\", found \"hk-mlp\"");
}

TEST_F(BadFile, FormatIsAnInteger) {
  set_int_attribute(file, "/model", "format", 1);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'format': expected a string, found int64");
}

TEST_F(BadFile, FormatStringWithLineBreakStaysOneLine) {
  set_string_attribute(file, "/model", "format", "hk\ntransformer");
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'format'");
}

TEST_F(BadFile, NewerFormatVersion) {
  set_int_attribute(file, "/model", "format_version", 2);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'format_version': expected 1, found 2");
}

TEST_F(BadFile, StringWhereIntegerExpected) {
  set_string_attribute(file, "/model", "d_model", "8");
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'd_model': expected an integer, found a string");
}

TEST_F(BadFile, FloatWhereIntegerExpected) {
  set_double_attribute(file, "/model", "n_heads", 2.0);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'n_heads': expected an integer, found float64");
}

TEST_F(BadFile, ArrayWhereScalarExpected) {
  RawFile f(file);
  const hid_t g = H5Gopen2(f.id(), "/model", H5P_DEFAULT);
  H5Adelete(g, "n_layers");
  const hsize_t two = 2;
  const hid_t space = H5Screate_simple(1, &two, nullptr);
  const hid_t a = H5Acreate2(g, "n_layers", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  const int64_t v[2] = {2, 2};
  H5Awrite(a, H5T_NATIVE_INT64, v);
  H5Aclose(a);
  H5Sclose(space);
  H5Gclose(g);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'n_layers': expected a scalar, found shape [2]");
}

TEST_F(BadFile, NonPositiveAndHugeSizes) {
  set_int_attribute(file, "/model", "ffn_dim", 0);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'ffn_dim': expected an integer in 1..2147483647, found 0");
  set_int_attribute(file, "/model", "ffn_dim", -12);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "found -12");
  set_int_attribute(file, "/model", "ffn_dim", int64_t(1) << 40);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "found 1099511627776");
  // An unsigned value beyond int64 must not wrap to something plausible.
  const uint64_t huge = std::numeric_limits<uint64_t>::max();
  set_attribute(file, "/model", "ffn_dim", H5T_STD_U64LE, H5T_NATIVE_UINT64, &huge);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'ffn_dim': expected an integer in 1..");
}

TEST_F(BadFile, SizesThatOverflow) {
  // 3 * D * D beyond 2^31 (ModelConfig::validate), found before any dataset is read.
  set_int_attribute(file, "/model", "d_model", 40000);
  set_int_attribute(file, "/model", "n_heads", 40000);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "too large");
}

TEST_F(BadFile, HeadsDoNotDivideDModel) {
  set_int_attribute(file, "/model", "n_heads", 3);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "d_model (8) must be a multiple of n_heads (3)");
}

TEST_F(BadFile, CausalNotZeroOrOne) {
  set_int_attribute(file, "/model", "causal", 2);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'causal': expected 0 or 1, found 2");
}

TEST_F(BadFile, CausalAsH5pyBoolIsAccepted) {
  set_bool_attribute(file, "/model", "causal", false);
  EXPECT_FALSE(io::read_model(file).config.causal);
  set_bool_attribute(file, "/model", "causal", true);
  EXPECT_TRUE(io::read_model(file).config.causal);
}

TEST_F(BadFile, NarrowIntegerTypesAndFixedStringsAreAccepted) {
  set_int_attribute(file, "/model", "d_model", 8, H5T_STD_U8LE);
  set_int_attribute(file, "/model", "n_heads", 2, H5T_STD_I16BE);
  set_string_attribute(file, "/model", "format", "hk-transformer", /*variable=*/false);
  const Model m = io::read_model(file);
  EXPECT_EQ(m.config.d_model, 8);
  EXPECT_EQ(m.config.n_heads, 2);
}

TEST_F(BadFile, EpsOptionalDefaultsAndIsChecked) {
  remove_attribute(file, "/model", "eps");
  EXPECT_EQ(io::read_model(file).config.eps, 1e-5);
  set_double_attribute(file, "/model", "eps", 1e-6, H5T_IEEE_F32LE);
  EXPECT_NEAR(io::read_model(file).config.eps, 1e-6, 1e-12);
  set_double_attribute(file, "/model", "eps", -1e-5);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'eps': expected a positive finite float");
  set_double_attribute(file, "/model", "eps", std::numeric_limits<double>::quiet_NaN());
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'eps': expected a positive finite float");
  set_string_attribute(file, "/model", "eps", "1e-5");
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model", "attribute 'eps': expected a float, found a string");
}

TEST_F(BadFile, LayerCountDisagreesWithFile) {
  set_int_attribute(file, "/model", "n_layers", 3);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers", "expected 3 layer groups (n_layers), found 2 members");
  set_int_attribute(file, "/model", "n_layers", 1);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers", "expected 1 layer groups (n_layers), found 2 members");
}

// ---- /model parameter datasets -------------------------------------------------------------

TEST_F(BadFile, MissingParameterDataset) {
  remove_link(file, "/model/layers/1/ffn_out/bias");
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers/1/ffn_out/bias",
                       "expected a float16/32/64 dataset of shape [8], found no such object");
}

TEST_F(BadFile, MissingParameterGroup) {
  remove_link(file, "/model/final_norm");
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/final_norm/weight", "found no such object");
}

TEST_F(BadFile, ParameterIsAGroup) {
  remove_link(file, "/model/layers/0/attn/q_proj/bias");
  RawFile f(file);
  H5Gclose(H5Gcreate2(f.id(), "/model/layers/0/attn/q_proj/bias", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers/0/attn/q_proj/bias", "found a group");
}

TEST_F(BadFile, WrongShape) {
  replace_dataset(file, "/model/layers/0/attn/k_proj/weight", H5T_IEEE_F32LE, {8, 9}, std::vector<double>(72, 0.1));
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers/0/attn/k_proj/weight", "expected shape [8, 8], found [8, 9]");
}

TEST_F(BadFile, TransposedFfnWeight) {
  // nn.Linear is [out, in]: ffn_in.weight is [F, D] = [12, 8]; its transpose must be refused.
  replace_dataset(file, "/model/layers/1/ffn_in/weight", H5T_IEEE_F32LE, {8, 12}, std::vector<double>(96, 0.1));
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers/1/ffn_in/weight", "expected shape [12, 8], found [8, 12]");
}

TEST_F(BadFile, WrongRank) {
  replace_dataset(file, "/model/final_norm/bias", H5T_IEEE_F32LE, {1, 8}, std::vector<double>(8, 0.0));
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/final_norm/bias", "expected shape [8], found [1, 8]");
  replace_dataset(file, "/model/final_norm/bias", H5T_IEEE_F32LE, {}, {0.0});
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/final_norm/bias", "expected shape [8], found []");
}

TEST_F(BadFile, IntegerWeights) {
  replace_dataset(file, "/model/layers/0/attn/v_proj/weight", H5T_STD_I32LE, {8, 8}, std::vector<double>(64, 1.0));
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers/0/attn/v_proj/weight",
                       "expected float16, float32 or float64, found int32");
}

TEST_F(BadFile, StringWeights) {
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, 4);
  replace_dataset(file, "/model/layers/0/norm1/weight", t, {8});
  H5Tclose(t);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers/0/norm1/weight",
                       "expected float16, float32 or float64, found a string");
}

TEST_F(BadFile, NonIeeeHalfIsRefused) {
  // bfloat16-like layout: 2 bytes but 8 exponent bits.
  const hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 7, 8, 0, 7);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 127);
  replace_dataset(file, "/model/layers/0/norm2/bias", t, {8});
  H5Tclose(t);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers/0/norm2/bias", "16-bit float of a non-IEEE layout");
}

TEST_F(BadFile, NaNInWeights) {
  poke_float(file, "/model/layers/1/attn/out_proj/weight", 3 * 8 + 5, std::numeric_limits<float>::quiet_NaN());
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers/1/attn/out_proj/weight",
                       "expected finite values, found NaN at [3, 5]");
}

TEST_F(BadFile, InfInBias) {
  poke_float(file, "/model/final_norm/bias", 7, -std::numeric_limits<float>::infinity());
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/final_norm/bias", "found -Inf at [7]");
}

TEST_F(BadFile, InfInFloat16Weights) {
  write_good_file(file, io::DType::float16);
  const uint16_t inf = 0x7c00;
  poke_raw(file, "/model/layers/0/ffn_in/weight", 13, &inf);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers/0/ffn_in/weight", "found +Inf at [1, 5]");
}

TEST_F(BadFile, NaNInFloat64Weights) {
  write_good_file(file, io::DType::float64);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  poke_raw(file, "/model/layers/0/attn/q_proj/bias", 0, &nan);
  HK_EXPECT_FILE_ERROR(model_error(), file, "/model/layers/0/attn/q_proj/bias", "found NaN at [0]");
}

// ---- /input ----------------------------------------------------------------------------------

TEST_F(BadFile, MissingInputGroup) {
  remove_link(file, "/input");
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input", "expected a group, found no such object");
}

TEST_F(BadFile, MissingX) {
  remove_link(file, "/input/x");
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/x", "expected a float32 or float16 dataset of shape [B, S, 8]");
}

TEST_F(BadFile, XWrongRank) {
  replace_dataset(file, "/input/x", H5T_IEEE_F32LE, {3, 40}, std::vector<double>(120, 0.5));
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/x", "expected rank 3 [B, S, 8], found shape [3, 40]");
}

TEST_F(BadFile, XWrongD) {
  replace_dataset(file, "/input/x", H5T_IEEE_F32LE, {3, 5, 16}, std::vector<double>(240, 0.5));
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/x", "expected shape [B, S, 8] (d_model of the model), found [3, 5, 16]");
}

TEST_F(BadFile, XFloat64Refused) {
  replace_dataset(file, "/input/x", H5T_IEEE_F64LE, {3, 5, 8}, std::vector<double>(120, 0.5));
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/x", "expected float32 or float16, found float64");
}

TEST_F(BadFile, XIntegerRefused) {
  replace_dataset(file, "/input/x", H5T_STD_I16LE, {3, 5, 8}, std::vector<double>(120, 1));
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/x", "found int16");
}

TEST_F(BadFile, XEmptyBatch) {
  replace_dataset(file, "/input/x", H5T_IEEE_F32LE, {0, 5, 8});
  remove_link(file, "/input/lengths");
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/x", "expected B, S and D >= 1, found shape [0, 5, 8]");
}

TEST_F(BadFile, XSizesThatOverflow) {
  // Chunked and never written: the file stays tiny while the shape claims 2^62 sequences.
  replace_dataset(file, "/input/x", H5T_IEEE_F32LE, {hsize_t(1) << 62, 5, 8}, {}, {1, 5, 8});
  remove_link(file, "/input/lengths");
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/x", "(overflow)");
  replace_dataset(file, "/input/x", H5T_IEEE_F32LE, {1, hsize_t(1) << 31, 8}, {}, {1, 1024, 8});
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/x", "S * D to hold at most 2^31-1 elements");
}

TEST_F(BadFile, LengthsWrongShape) {
  replace_dataset(file, "/input/lengths", H5T_STD_I32LE, {4}, {1, 1, 1, 1});
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/lengths", "expected shape [3] (one length per sequence of x), found [4]");
}

TEST_F(BadFile, LengthsFloatRefused) {
  replace_dataset(file, "/input/lengths", H5T_IEEE_F32LE, {3}, {1, 2, 3});
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/lengths", "expected an integer type, found float32");
}

TEST_F(BadFile, LengthAboveS) {
  replace_dataset(file, "/input/lengths", H5T_STD_I64LE, {3}, {5, 6, 0});
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/lengths", "expected values in 0..5, found 6 at [1]");
}

TEST_F(BadFile, NegativeLength) {
  replace_dataset(file, "/input/lengths", H5T_STD_I8LE, {3}, {1, 2, -1});
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/lengths", "found -1 at [2]");
}

TEST_F(BadFile, HugeUnsignedLength) {
  RawFile f(file);
  H5Ldelete(f.id(), "/input/lengths", H5P_DEFAULT);
  const hsize_t n = 3;
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t d = H5Dcreate2(f.id(), "/input/lengths", H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const uint64_t v[3] = {1, std::numeric_limits<uint64_t>::max(), 2};
  H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
  H5Dclose(d);
  H5Sclose(space);
  HK_EXPECT_FILE_ERROR(input_error(), file, "/input/lengths", "expected values in 0..5, found");
  EXPECT_NE(input_error().find("at [1]"), std::string::npos);
}

TEST_F(BadFile, AnyIntegerTypeOfLengthsIsAccepted) {
  replace_dataset(file, "/input/lengths", H5T_STD_U16BE, {3}, {5, 0, 3});
  const Model m = io::read_model(file);
  io::InputFile in(file, m.config);
  std::vector<float> x(size_t(kB) * kS * 8);
  std::vector<int32_t> len(kB);
  in.read(0, kB, x.data(), len.data());
  EXPECT_EQ(len, (std::vector<int32_t>{5, 0, 3}));
}

TEST_F(BadFile, NaNInXIsFoundInItsChunkOnly) {
  // Sequence 2, position 4, feature 6: chunks before it read fine, its chunk names the index.
  poke_float(file, "/input/x", (2 * kS + 4) * 8 + 6, std::numeric_limits<float>::quiet_NaN());
  const Model m = io::read_model(file);
  io::InputFile in(file, m.config);  // opening does not read x
  std::vector<float> x(size_t(kS) * 8);
  int32_t len;
  in.read(0, 1, x.data(), &len);
  in.read(1, 1, x.data(), &len);
  HK_EXPECT_FILE_ERROR(error_of([&] { in.read(2, 1, x.data(), &len); }), file, "/input/x",
                       "expected finite values, found NaN at [2, 4, 6]");
}

TEST_F(BadFile, InfInFloat16X) {
  write_good_file(file, io::DType::float32, io::DType::float16);
  const uint16_t minus_inf = 0xfc00;
  poke_raw(file, "/input/x", (1 * kS + 0) * 8 + 3, &minus_inf);
  const Model m = io::read_model(file);
  io::InputFile in(file, m.config);
  std::vector<float> x(size_t(kB) * kS * 8);
  HK_EXPECT_FILE_ERROR(error_of([&] { in.read(0, kB, x.data(), nullptr); }), file, "/input/x", "found -Inf at [1, 0, 3]");
}

TEST_F(BadFile, ReadOutsideTheBatch) {
  const Model m = io::read_model(file);
  io::InputFile in(file, m.config);
  std::vector<float> x(size_t(kB + 1) * kS * 8);
  HK_EXPECT_FILE_ERROR(error_of([&] { in.read(2, 2, x.data(), nullptr); }), file, "/input/x", "expected a range inside [0, 3)");
}

TEST_F(BadFile, ModelAndInputInSeparateFiles) {
  // The model file lacks /input and the input file lacks /model: each error names its own file.
  const std::string model_file = dir.path("model.h5"), input_file = dir.path("input.h5");
  const Model m = synthetic_model(small_config(), 3);
  io::write_model(model_file, m);
  const std::vector<float> x = synthetic_input(2, 4, 8, 3);
  io::write_input(input_file, 2, 4, 8, x.data(), nullptr);
  HK_EXPECT_FILE_ERROR(error_of([&] { io::read_model(input_file); }), input_file, "/model", "found no such object");
  HK_EXPECT_FILE_ERROR(error_of([&] { io::InputFile in(model_file); }), model_file, "/input", "found no such object");
  const Model back = io::read_model(model_file);
  io::InputFile in(input_file, back.config);
  EXPECT_EQ(in.batch(), 2);
  EXPECT_FALSE(in.has_lengths());
}

}  // namespace
}  // namespace hk::test
