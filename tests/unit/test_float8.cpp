#define BOOST_TEST_MODULE float8
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <vector>

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
