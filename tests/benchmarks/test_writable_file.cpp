// The benchmarks' --json check (benchmarks/common/writable_file.h): a path
// the results could not be written to is refused when the flags are read.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/writable_file.h"

namespace {
// The error CLI11 reports for --json `path`, or "" when it is accepted.
std::string parse_error(const std::string& path) {
  CLI::App app;
  std::string file;
  app.add_option("--json", file)->check(lockstep::bench::writable_file);
  std::vector<std::string> args{path, "--json"};  // CLI11 parses a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a benchmark's --json file is checked before the benchmark runs") {
  const auto dir = std::filesystem::temp_directory_path();
  CHECK(parse_error((dir / "lockstep-bench-results.json").string()).empty());
  CHECK_FALSE(std::filesystem::exists(dir / "lockstep-bench-results.json"));  // nothing written
  CHECK_THAT(parse_error("/nonexistent-lockstep-dir/results.json"),
             Catch::Matchers::Contains("cannot create files in /nonexistent-lockstep-dir"));
  CHECK_THAT(parse_error(dir.string()), Catch::Matchers::Contains("it names a directory"));
}
