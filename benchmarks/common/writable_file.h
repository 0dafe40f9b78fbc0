// --json FILE and the like: a file the benchmark writes only at its end is
// checked when the flags are read (the directory exists and takes new files,
// the path is not a directory), so that a typo costs an error, not the run.
#pragma once

#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "lockstep/runtime/checkpoint/atomic_file.h"

namespace lockstep::bench {

inline const CLI::Validator writable_file(
    [](std::string& path) -> std::string {
      try {
        runtime::check_can_write_file(path);
      } catch (const std::exception& e) {
        return e.what();
      }
      return {};
    },
    "FILE");

}  // namespace lockstep::bench
