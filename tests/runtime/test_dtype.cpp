// DType sizes, names and promotion; Device parsing and printing; the dispatch
// helpers' errors.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "lockstep/runtime/dtype.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

TEST_CASE("dtype sizes, names and floating-ness", "[runtime][dtype]") {
  struct Row {
    DType dtype;
    size_t size;
    const char* name;
    bool floating;
  };
  const Row row = GENERATE(Row{DType::f32, 4, "f32", true}, Row{DType::f64, 8, "f64", true},
                           Row{DType::bf16, 2, "bf16", true}, Row{DType::f16, 2, "f16", true},
                           Row{DType::i32, 4, "i32", false}, Row{DType::i64, 8, "i64", false},
                           Row{DType::u8, 1, "u8", false}, Row{DType::boolean, 1, "bool", false});
  INFO(row.name);
  CHECK(dtype_size(row.dtype) == row.size);
  CHECK(dtype_name(row.dtype) == row.name);
  CHECK(is_floating(row.dtype) == row.floating);
}

TEST_CASE("dtype_of maps C++ types to dtypes", "[runtime][dtype]") {
  STATIC_REQUIRE(dtype_v<float> == DType::f32);
  STATIC_REQUIRE(dtype_v<double> == DType::f64);
  STATIC_REQUIRE(dtype_v<bf16> == DType::bf16);
  STATIC_REQUIRE(dtype_v<f16> == DType::f16);
  STATIC_REQUIRE(dtype_v<int32_t> == DType::i32);
  STATIC_REQUIRE(dtype_v<int64_t> == DType::i64);
  STATIC_REQUIRE(dtype_v<uint8_t> == DType::u8);
  STATIC_REQUIRE(dtype_v<bool> == DType::boolean);
  // The storage types have the sizes the dtypes promise.
  STATIC_REQUIRE(sizeof(bf16) == 2);
  STATIC_REQUIRE(sizeof(f16) == 2);
  STATIC_REQUIRE(sizeof(bool) == 1);
}

TEST_CASE("promote_types: floating beats integer, wider beats narrower", "[runtime][dtype]") {
  struct Row {
    DType a, b, expected;
  };
  const Row row = GENERATE(Row{DType::f32, DType::f64, DType::f64},
                           Row{DType::f32, DType::bf16, DType::f32},
                           Row{DType::f32, DType::f16, DType::f32},
                           Row{DType::f64, DType::f16, DType::f64},
                           Row{DType::bf16, DType::f16, DType::f32},  // no common 16-bit type
                           Row{DType::i64, DType::f32, DType::f32},
                           Row{DType::i64, DType::f16, DType::f16},
                           Row{DType::i32, DType::bf16, DType::bf16},
                           Row{DType::u8, DType::f64, DType::f64},
                           Row{DType::boolean, DType::f32, DType::f32},
                           Row{DType::i32, DType::i64, DType::i64},
                           Row{DType::u8, DType::i32, DType::i32},
                           Row{DType::boolean, DType::u8, DType::u8},
                           Row{DType::boolean, DType::i64, DType::i64});
  INFO(dtype_name(row.a) << " with " << dtype_name(row.b));
  CHECK(promote_types(row.a, row.b) == row.expected);
  CHECK(promote_types(row.b, row.a) == row.expected);
}

TEST_CASE("promote_types is symmetric and idempotent over every pair", "[runtime][dtype]") {
  for (DType a : kAllDTypes) {
    CHECK(promote_types(a, a) == a);
    for (DType b : kAllDTypes) {
      INFO(dtype_name(a) << " with " << dtype_name(b));
      DType p = promote_types(a, b);
      CHECK(p == promote_types(b, a));
      // The result is never narrower in kind: floating if either is.
      CHECK(is_floating(p) == (is_floating(a) || is_floating(b)));
      // Promoting again with either operand changes nothing.
      CHECK(promote_types(p, a) == p);
      CHECK(promote_types(p, b) == p);
    }
  }
}

TEST_CASE("Device::parse and str", "[runtime][dtype][device]") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cpu").is_cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:0") == Device::cuda(0));
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  CHECK(Device::parse("cuda:12").index == 12);
  CHECK(Device::parse("cuda:1").is_cuda());
  CHECK_FALSE(Device::parse("cuda:1").is_cpu());

  CHECK(Device::cpu().str() == "cpu");
  CHECK(Device::cuda(0).str() == "cuda:0");
  CHECK(Device::cuda(7).str() == "cuda:7");
  for (Device d : {Device::cpu(), Device::cuda(0), Device::cuda(5)})
    CHECK(Device::parse(d.str()) == d);

  CHECK(Device::cuda(1) != Device::cuda(2));
  CHECK(Device::cpu() != Device::cuda(0));
}

TEST_CASE("Device::parse rejects bad strings with a clear error", "[runtime][dtype][device]") {
  const std::string bad =
      GENERATE("", "gpu", "CPU", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "cuda: 1", " cpu",
               "cpu:0", "cuda:1:2", "cuda:99999999999999999999");
  INFO("'" << bad << "'");
  CHECK_THROWS_AS(Device::parse(bad), lockstep::Error);
  CHECK_THROWS_WITH(Device::parse(bad), Contains("'" + bad + "'") && Contains("cuda:N"));
}

TEST_CASE("dispatch helpers name the op and the dtype they refuse", "[runtime][dtype]") {
  auto size_of = [](auto tag) { return sizeof(tag); };
  CHECK(dispatch_float(DType::f32, "myop", size_of) == 4);
  CHECK(dispatch_float(DType::f64, "myop", size_of) == 8);
  CHECK_THROWS_WITH(dispatch_float(DType::i32, "myop", size_of),
                    Contains("myop") && Contains("i32"));
  CHECK_THROWS_WITH(dispatch_float(DType::bf16, "myop", size_of), Contains("bf16"));
  CHECK(dispatch_arith(DType::i64, "myop", size_of) == 8);
  CHECK_THROWS_WITH(dispatch_arith(DType::u8, "myop", size_of),
                    Contains("myop") && Contains("u8"));
  for (DType d : kAllDTypes) CHECK(dispatch_all(d, size_of) == dtype_size(d));
}
