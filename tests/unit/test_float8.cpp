#define BOOST_TEST_MODULE float8
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "device/cuda/float8_math.hpp"
#include "tensor/float8.hpp"

using namespace meshtrain;

// Hand-checked values of the OCP formats (validation/check_float8.py checks every code and tie).
BOOST_AUTO_TEST_CASE(rounding_is_nearest_even_with_saturation_and_subnormals) {
  const auto e4 = [](float x) { return float8_round(x, Float8Format::kE4M3); };
  const auto e5 = [](float x) { return float8_round(x, Float8Format::kE5M2); };
  BOOST_TEST(e4(1.0625f) == 1.0f);     // tie between 1.000 and 1.001 (binary mantissas): the even one
  BOOST_TEST(e4(1.1875f) == 1.25f);    // tie between 1.001 and 1.010
  BOOST_TEST(e4(-1.1f) == -1.125f);
  BOOST_TEST(e4(448.0f) == 448.0f);
  BOOST_TEST(e4(464.0f) == 448.0f);    // beyond the largest finite value: saturates
  BOOST_TEST(e4(std::numeric_limits<float>::infinity()) == 448.0f);
  BOOST_TEST(e4(std::ldexp(1.0f, -10)) == 0.0f);                    // half the smallest subnormal: tie to 0
  BOOST_TEST(e4(3 * std::ldexp(1.0f, -11)) == std::ldexp(1.0f, -9));  // 0.75 of it: up
  BOOST_TEST(e4(std::ldexp(7.0f, -9)) == std::ldexp(7.0f, -9));     // the largest subnormal, exact
  BOOST_TEST(std::signbit(e4(-0.0f)));
  BOOST_TEST(std::isnan(e4(std::nanf(""))));
  BOOST_TEST(e5(1.125f) == 1.0f);      // e5m2: 1.00 / 1.01, tie to the even 1.00
  BOOST_TEST(e5(1e6f) == 57344.0f);
  BOOST_TEST(e5(-std::numeric_limits<float>::infinity()) == -57344.0f);
  BOOST_TEST(e5(std::ldexp(3.0f, -17)) == std::ldexp(2.0f, -16));  // 1.5 subnormal steps: tie to even 2
  BOOST_CHECK_THROW(parse_float8_format("e3m4"), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(scales_follow_torchao) {
  BOOST_TEST(float8_scale(3.0f, Float8Format::kE4M3, false) == float(448.0 / 3.0));
  BOOST_TEST(float8_scale(3.0f, Float8Format::kE4M3, true) == 128.0f);  // 149.33… rounded down to 2^7
  BOOST_TEST(float8_scale(0.0f, Float8Format::kE5M2, false) == float(57344.0 / 1e-12));
  BOOST_TEST(float8_scale(std::numeric_limits<float>::infinity(), Float8Format::kE4M3, true) == 0.0f);
  // Rowwise: each row its own scale; a row of zeros stays zero; the amax element maps to max.
  const std::vector<float> x = {1.0f, -3.0f, 0.1f, 0.0f, 0.0f, 0.0f};
  std::vector<float> out(6), scales(2);
  float8_fake_quantize(x.data(), 2, 3, Float8Format::kE4M3, Float8Scaling::kRowwise, true, out.data(), scales.data());
  BOOST_TEST(scales[0] == 128.0f);
  BOOST_TEST(out[1] == -3.0f);          // −384 is an e4m3 value: exact after the scale
  BOOST_TEST(out[0] == 1.0f);
  BOOST_TEST(out[2] == 13.0f / 128.0f);  // 12.8 → 13 (1.625 · 2^3), back to 0.1015625
  BOOST_TEST(out[3] == 0.0f);
  BOOST_CHECK_THROW(float8_fake_quantize(x.data(), -1, 3, Float8Format::kE4M3, Float8Scaling::kRowwise, true,
                                         out.data()), std::invalid_argument);
}

// TorchAO's recipes (torchao/float8/config.py, from_recipe_name), operand by operand.
BOOST_AUTO_TEST_CASE(linear_recipes_match_torchao) {
  using F = Float8Format;
  using S = Float8Scaling;
  const auto is = [](const Float8Cast& c, F f, S s) { return c.quantize && c.format == f && c.scaling == s; };
  const Float8LinearRecipe t = float8_linear_recipe("tensorwise");
  BOOST_TEST(!t.power_of_two);
  BOOST_TEST((is(t.output_x, F::kE4M3, S::kTensorwise) && is(t.output_w, F::kE4M3, S::kTensorwise)));
  BOOST_TEST((is(t.grad_input_dy, F::kE5M2, S::kTensorwise) && is(t.grad_input_w, F::kE4M3, S::kTensorwise)));
  BOOST_TEST((is(t.grad_weight_dy, F::kE5M2, S::kTensorwise) && is(t.grad_weight_x, F::kE4M3, S::kTensorwise)));
  const Float8LinearRecipe r = float8_linear_recipe("rowwise");
  BOOST_TEST(r.power_of_two);
  BOOST_TEST((is(r.output_x, F::kE4M3, S::kRowwise) && is(r.output_w, F::kE4M3, S::kRowwise)));
  BOOST_TEST((is(r.grad_input_dy, F::kE4M3, S::kRowwise) && is(r.grad_input_w, F::kE4M3, S::kColumnwise)));
  BOOST_TEST((is(r.grad_weight_dy, F::kE4M3, S::kColumnwise) && is(r.grad_weight_x, F::kE4M3, S::kColumnwise)));
  const Float8LinearRecipe h = float8_linear_recipe("rowwise_with_gw_hp");
  BOOST_TEST(h.power_of_two);
  BOOST_TEST((is(h.output_x, F::kE4M3, S::kRowwise) && is(h.grad_input_dy, F::kE4M3, S::kRowwise)));
  BOOST_TEST(is(h.grad_input_w, F::kE4M3, S::kTensorwise));
  BOOST_TEST((!h.grad_weight_dy.quantize && !h.grad_weight_x.quantize));
  BOOST_CHECK_THROW(float8_linear_recipe("mxfp8"), std::invalid_argument);
  // A high-precision operand is copied unchanged; a cast one goes through the emulation.
  const std::vector<float> x = {0.1f, -3.0f, 1e-3f, 7.0f};
  std::vector<float> out(4), want(4);
  float8_cast_operand(x.data(), 2, 2, h.grad_weight_x, h.power_of_two, out.data());
  BOOST_TEST(out == x);
  float8_cast_operand(x.data(), 2, 2, r.grad_input_w, r.power_of_two, out.data());
  float8_fake_quantize(x.data(), 2, 2, F::kE4M3, S::kColumnwise, true, want.data());
  BOOST_TEST(out == want);
}

// The split cast of tensor-parallel operands (float8_group_amax, then float8_quantize_with_amax
// with the max over the shards' amax) equals the cast of the whole tensor, bit for bit: each
// scaling group sees one amax however the tensor is split.
BOOST_AUTO_TEST_CASE(group_amax_over_shards_reproduces_the_whole_cast) {
  const int64_t rows = 6, cols = 8;
  std::vector<float> x(rows * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * float(i)) * (1.0f + float(i % 5)) * 3.0f;
  for (Float8Scaling s : {Float8Scaling::kTensorwise, Float8Scaling::kRowwise, Float8Scaling::kColumnwise})
    for (bool pow2 : {false, true}) {
      std::vector<float> whole(x.size());
      float8_fake_quantize(x.data(), rows, cols, Float8Format::kE4M3, s, pow2, whole.data());
      // Split the columns (a row-parallel operand) into two shards, or the rows (a column-split one).
      const bool split_cols = s != Float8Scaling::kColumnwise;
      const int64_t half_r = split_cols ? rows : rows / 2, half_c = split_cols ? cols / 2 : cols;
      std::vector<std::vector<float>> shard(2, std::vector<float>(static_cast<size_t>(half_r * half_c)));
      for (int k = 0; k < 2; ++k)
        for (int64_t r = 0; r < half_r; ++r)
          for (int64_t c = 0; c < half_c; ++c)
            shard[k][size_t(r * half_c + c)] =
                x[size_t((r + (split_cols ? 0 : k * half_r)) * cols + c + (split_cols ? k * half_c : 0))];
      const int64_t groups = float8_group_count(half_r, half_c, s);
      std::vector<float> a0(static_cast<size_t>(groups)), a1(static_cast<size_t>(groups));
      float8_group_amax(shard[0].data(), half_r, half_c, s, a0.data());
      float8_group_amax(shard[1].data(), half_r, half_c, s, a1.data());
      // The shards' own amax differ from the whole tensor's somewhere: without the max over
      // them the casts below would differ, so the comparison can fail.
      BOOST_TEST((a0 != a1));
      for (size_t g = 0; g < a0.size(); ++g) a0[g] = std::max(a0[g], a1[g]);  // the all-reduce with max
      for (int k = 0; k < 2; ++k) {
        std::vector<float> q(shard[k].size());
        float8_quantize_with_amax(shard[k].data(), half_r, half_c, Float8Format::kE4M3, s, pow2, a0.data(), q.data());
        for (int64_t r = 0; r < half_r; ++r)
          for (int64_t c = 0; c < half_c; ++c)
            BOOST_TEST(q[size_t(r * half_c + c)] ==
                       whole[size_t((r + (split_cols ? 0 : k * half_r)) * cols + c + (split_cols ? k * half_c : 0))]);
      }
    }
  // A NaN or ±inf reports +inf (kept by a max over ranks); its whole group dequantizes to NaN.
  std::vector<float> y = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f, 3.0f};
  float amax = 0;
  float8_group_amax(y.data(), 1, 4, Float8Scaling::kTensorwise, &amax);
  BOOST_TEST(std::isinf(amax));
  std::vector<float> q(4);
  float8_quantize_with_amax(y.data(), 1, 4, Float8Format::kE4M3, Float8Scaling::kTensorwise, false, &amax, q.data());
  for (float v : q) BOOST_TEST(std::isnan(v));
}

// The arithmetic the CUDA cast kernels run (device/cuda/float8_math.hpp, compiled here as plain
// C++) against this emulation: rounding bit for bit over a sweep of float32 bit patterns that
// covers every exponent, every midpoint between neighbouring codes, saturation, subnormals, ±0,
// ±inf and NaN; scales for amax values across the range; the codes of every representable value.
BOOST_AUTO_TEST_CASE(device_arithmetic_matches_the_emulation) {
  const auto same = [](float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
  };
  for (const Float8Format f : {Float8Format::kE4M3, Float8Format::kE5M2}) {
    const f8::Format g = f == Float8Format::kE4M3 ? f8::e4m3() : f8::e5m2();
    const Float8Limits l = float8_limits(f);
    BOOST_TEST((g.mantissa_bits == l.mantissa_bits && g.min_normal_exp == l.min_normal_exp && g.max == l.max));
    std::vector<float> xs;
    for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 65521) xs.push_back(std::bit_cast<float>(uint32_t(u)));
    // Every code, its neighbours' midpoints and the floats just around them (ties and near-ties).
    std::vector<float> codes;
    for (int c = 0; c < 256; ++c) {
      const float v = f8::decode(uint8_t(c), g);
      if (std::isfinite(v)) codes.push_back(v);
    }
    std::sort(codes.begin(), codes.end());
    for (size_t i = 0; i + 1 < codes.size(); ++i) {
      const float mid = 0.5f * (codes[i] + codes[i + 1]);
      for (float x : {mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY), codes[i]}) xs.push_back(x);
    }
    for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, std::nanf(""), l.max * 1.03125f, l.max * 1.0625f,
                    std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()})
      xs.push_back(x);
    int64_t mismatches = 0;
    for (float x : xs) {
      const float want = float8_round(x, f), got = f8::round(x, g);
      if (!same(want, got)) ++mismatches;
      // The code of a rounded value decodes back to it (NaN to a NaN).
      if (!same(f8::decode(f8::encode(got, g), g), got)) ++mismatches;
    }
    BOOST_TEST(mismatches == 0);
    // Every finite code: encode is decode's inverse (the two zeros included).
    for (int c = 0; c < 256; ++c) {
      const float v = f8::decode(uint8_t(c), g);
      if (std::isfinite(v)) BOOST_TEST(int(f8::encode(v, g)) == c);
    }
    for (bool pow2 : {false, true})
      for (float a : {0.0f, 1e-13f, 1e-12f, 3.0f, 448.0f, 1e30f, 3.4e38f, std::numeric_limits<float>::denorm_min(),
                      INFINITY, std::nanf(""), 0.1f, 57344.0f, 7.5e-6f})
        BOOST_TEST(same(f8::scale(a, g, pow2), float8_scale(a, f, pow2)), "amax " << a << " pow2 " << pow2);
  }
  // Amax keys: integer order is |x| order; NaN and ±inf give +inf.
  BOOST_TEST(f8::amax_key(-2.0f) == std::bit_cast<uint32_t>(2.0f));
  BOOST_TEST(f8::amax_key(std::nanf("")) == std::bit_cast<uint32_t>(INFINITY));
  BOOST_TEST(f8::amax_key(-INFINITY) == std::bit_cast<uint32_t>(INFINITY));
  BOOST_TEST(f8::amax_key(-0.0f) == 0u);
  BOOST_TEST(f8::amax_key(3.0f) > f8::amax_key(-2.5f));
}
