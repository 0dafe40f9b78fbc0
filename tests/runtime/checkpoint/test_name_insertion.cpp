// runtime::name_insertion: the segment that tells two lists of names apart.
#include <catch2/catch.hpp>

#include "lockstep/runtime/checkpoint/name_insertion.h"

using lockstep::runtime::name_insertion;
using Names = std::vector<std::string>;

TEST_CASE("name insertion: a wrapper's segment at the front or after a shared head",
          "[checkpoint]") {
  const auto front =
      name_insertion({"fc.weight", "fc.bias"}, {"module.fc.weight", "module.fc.bias"});
  REQUIRE(front);
  CHECK(front->head.empty());
  CHECK(front->segment == "module.");
  CHECK(front->in_found);
  CHECK(front->count == 2);
  CHECK(front->of == 2);

  // A training checkpoint's "model." kept in front of a DDP wrapper's names.
  const Names expected{"model.fc.weight", "model.fc.bias", "model.out.weight"};
  const Names found{"model.module.fc.weight", "model.module.fc.bias", "model.module.out.weight"};
  const auto after = name_insertion(expected, found);
  REQUIRE(after);
  CHECK(after->head == "model.");
  CHECK(after->segment == "module.");
  CHECK(after->in_found);
  CHECK_FALSE(name_insertion(expected, found, /*front_only=*/true));

  // The other way round: the expected names have it.
  const auto reversed = name_insertion(found, expected);
  REQUIRE(reversed);
  CHECK_FALSE(reversed->in_found);
  CHECK(reversed->segment == "module.");
}

TEST_CASE("name insertion: none when nothing pairs up, too few do, or two explain equally",
          "[checkpoint]") {
  CHECK_FALSE(name_insertion({"a.weight"}, {"b.weight"}));
  CHECK_FALSE(name_insertion({}, {"module.a"}));
  // One of four pairs up: a guess.
  CHECK_FALSE(name_insertion({"a", "b", "c", "d"}, {"x.a", "p", "q", "r"}));
  // "x." and "y." each explain one name.
  CHECK_FALSE(name_insertion({"a", "b"}, {"x.a", "y.b"}));
}
