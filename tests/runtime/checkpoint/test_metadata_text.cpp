// Text in checkpoint headers: numbers (subnormal ones included) read back
// through one parser, UTF-8 checked where the header is written, and bytes
// kept whole by escaping. The reader's refusals: test_corruption.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "lockstep/runtime/checkpoint/checkpoint.h"
#include "lockstep/runtime/checkpoint/metadata_text.h"
#include "runtime/checkpoint/checkpoint_test_util.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;
namespace fs = std::filesystem;

TEST_CASE("metadata text: numbers read back to the same bits, subnormal ones included",
          "[checkpoint]") {
  const double values[] = {0.0,
                           -0.0,
                           0.1,
                           1e300,
                           5e-310,  // subnormal: std::stod throws out_of_range
                           std::numeric_limits<double>::denorm_min(),
                           -std::numeric_limits<double>::denorm_min(),
                           std::numeric_limits<double>::max(),
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()};
  for (const double v : values) {
    INFO(metadata_number(v));
    const auto back = parse_metadata_number(metadata_number(v));
    REQUIRE(back);
    CHECK(std::memcmp(&*back, &v, sizeof v) == 0);
  }
  CHECK(std::isnan(*parse_metadata_number(metadata_number(std::nan("")))));
  for (const char* bad : {"", " 1", "1 ", "+1", "0x10", "1e400", "1,5", "one"}) {
    INFO(bad);
    CHECK_FALSE(parse_metadata_number(bad));
  }
}

TEST_CASE("metadata text: UTF-8 is checked, and escaping keeps any bytes whole", "[checkpoint]") {
  CHECK(is_utf8("plain ascii"));
  CHECK(is_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  CHECK(utf8_prefix_length("/tmp/fort\xe9") == 9);                 // Latin-1 e-acute
  CHECK_FALSE(is_utf8("\xc0\xaf"));                                // overlong '/'
  CHECK_FALSE(is_utf8("\xed\xa0\x80"));                            // a surrogate
  CHECK_FALSE(is_utf8("\xf4\x90\x80\x80"));                        // above U+10FFFF
  CHECK_FALSE(is_utf8("\xe2\x82"));                                // cut short

  for (const std::string& bytes :
       {std::string("/tmp/fort\xe9"), std::string("a\\b\\x41"), std::string("\xff\xfe\\"),
        std::string("caf\xc3\xa9\x80"), std::string("nul\0inside", 10), std::string()}) {
    const std::string escaped = escape_bytes(bytes);
    INFO(escaped);
    CHECK(is_utf8(escaped));
    CHECK(unescape_bytes(escaped) == bytes);
  }
  CHECK(escape_bytes("/tmp/fort\xe9") == "/tmp/fort\\xe9");
  CHECK(escape_bytes("caf\xc3\xa9") == "caf\xc3\xa9");  // valid UTF-8 stays as it is
  for (const char* bad : {"\\", "\\x4", "\\q", "\\xzz"}) CHECK_FALSE(unescape_bytes(bad));
}

TEST_CASE("safetensors header: text that is not UTF-8 is refused when written, naming it",
          "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("latin1.safetensors");
  CheckpointContent value = small_content();
  value.metadata["data"] = "/tmp/fort\xe9";
  CHECK_THAT(error_of([&] { save_checkpoint(path, value); }),
             Contains("value of metadata 'data'") && Contains("not UTF-8") &&
                 Contains("byte 0xe9 at offset 9") && Contains("/tmp/fort\\xe9"));

  CheckpointContent key = small_content();
  key.metadata["caf\xe9"] = "x";
  CHECK_THAT(error_of([&] { save_checkpoint(path, key); }),
             Contains("metadata key 'caf\\xe9'") && Contains("not UTF-8"));

  CheckpointContent tensor = small_content();
  tensor.tensors.emplace_back("layer\xff.weight", random_tensor({2}, DType::f32));
  CHECK_THAT(error_of([&] { save_checkpoint(path, tensor); }),
             Contains("tensor name 'layer\\xff.weight'") && Contains("rename the tensor"));
  CHECK(fs::is_empty(dir.str()));  // nothing written
}
