// The one main() of lockstep_tests; the test cases live in the other files.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
