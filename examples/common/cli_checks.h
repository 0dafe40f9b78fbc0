// Checks for the numeric flags of the examples and the benchmarks. CLI11's
// PositiveNumber reports a bad value as "not in range 0.000000 to
// 1797693...": these name the rule instead ("--lr: must be a positive number,
// not 0"). The benchmarks include it from here.
#pragma once

#include <cmath>
#include <string>

#include <CLI/CLI.hpp>

namespace cli_checks {

namespace detail {

template <class Accept>
CLI::Validator number_check(const char* rule, Accept accept) {
  return CLI::Validator(
      [rule, accept](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || !std::isfinite(value) || !accept(value))
          return std::string("must be ") + rule + ", not " + text;
        return {};
      },
      rule);
}

}  // namespace detail

// A finite number above zero.
inline const CLI::Validator positive =
    detail::number_check("a positive number", [](double v) { return v > 0; });

// A finite number, zero or above.
inline const CLI::Validator non_negative =
    detail::number_check("zero or a positive number", [](double v) { return v >= 0; });

}  // namespace cli_checks
