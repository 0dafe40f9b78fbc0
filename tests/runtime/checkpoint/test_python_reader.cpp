// scripts/read_checkpoint.py (numpy only) reads what lockstep writes: the
// script prints a CRC-32 of each tensor's values as float64, compared here
// with the same digest of the tensors in C++. Skipped where no python3 with
// numpy is found.
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "lockstep/runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/checkpoint_test_util.h"
#include "support/skip.h"
#include "support/subprocess.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

const std::string kScript = std::string(LOCKSTEP_SOURCE_DIR) + "/scripts/read_checkpoint.py";
const char* const kNoNumpy = "no python3 with numpy found (apt-get install python3-numpy)";

// The first python3 that imports numpy: the one on PATH, then the system's
// (a pyenv python3 on PATH may lack numpy where the system one has it).
std::vector<std::string> python_with_numpy() {
  for (std::vector<std::string> python : {std::vector<std::string>{"/usr/bin/env", "python3"},
                                          std::vector<std::string>{"/usr/bin/python3"}}) {
    auto probe = python;
    probe.insert(probe.end(), {"-c", "import numpy"});
    if (run_process(probe, std::chrono::seconds(60)).ok()) return python;
  }
  return {};
}

std::string numpy_dtype(DType d) {
  switch (d) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::bf16:
      return "float32";  // widened by the reader
    case DType::f16:
      return "float16";
    case DType::i32:
      return "int32";
    case DType::i64:
      return "int64";
    case DType::u8:
      return "uint8";
    case DType::boolean:
      return "bool";
  }
  return "?";
}

// CRC-32 of the values as little-endian float64, like the script's --digest.
uint32_t digest(const Tensor& t) {
  const std::vector<double> v = values(t);
  return static_cast<uint32_t>(crc32_z(0, reinterpret_cast<const Bytef*>(v.data()), v.size() * 8));
}

// A safetensors file of `json` (padded to 8 bytes) and `data`.
std::string safetensors_bytes(std::string json, const std::string& data) {
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(bytes.data(), &n, 8);
  return bytes + json + data;
}

}  // namespace

TEST_CASE("checkpoint: the numpy reader loads the weights", "[checkpoint][python]") {
  const auto python = python_with_numpy();
  LOCKSTEP_SKIP_IF(python.empty() ? kNoNumpy : "");
  TempDir dir;
  CheckpointContent c;
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16,
                          DType::i32, DType::i64, DType::u8,   DType::boolean};
  for (DType dt : dtypes) {
    std::vector<double> v(15);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) * 0.37 + (i % 3 == 0);
    c.tensors.emplace_back("w." + std::string(dtype_name(dt)),
                           Tensor::from_vector(v, {3, 5}).to(dt));
  }
  c.tensors.emplace_back("scalar", Tensor::scalar(2.5));
  // A 0-d bf16 (a scalar parameter of a model in bf16): the widening crashed on it.
  c.tensors.emplace_back("scalar.bf16", Tensor::scalar(-1.75).to(DType::bf16));
  c.tensors.emplace_back("empty", Tensor::zeros({0, 3}));
  c.tensors.emplace_back("transposed", Tensor::arange(12, DType::f32).reshape({3, 4}).t());
  c.metadata = {{"epoch", "7"}};
  const std::string path = dir.file("py.safetensors");
  save_checkpoint(path, c);

  auto argv = python;
  argv.insert(argv.end(), {kScript, path, "--digest"});
  const ProcessResult r = run_process(argv, std::chrono::seconds(120));
  INFO(r.output);
  REQUIRE(r.ok());
  for (const auto& [name, t] : c.tensors)
    CHECK_THAT(r.output, Contains(fmt::format("{} {} {} {:08x}\n", name, numpy_dtype(t.dtype()),
                                              shape_str(t.shape()), digest(t))));
  CHECK_THAT(r.output, Contains("metadata epoch=7"));

  // load() leaves lockstep's checksums out of the metadata it returns: a file
  // saved again with them would be refused as corrupt.
  auto load = python;
  load.insert(load.end(),
              {"-c", fmt::format("import sys; sys.path.insert(0, '{}/scripts'); "
                                 "import read_checkpoint as r; t, m = r.load('{}'); "
                                 "print(sorted(m), repr(t['scalar.bf16']))",
                                 LOCKSTEP_SOURCE_DIR, path)});
  const ProcessResult meta = run_process(load, std::chrono::seconds(120));
  INFO(meta.output);
  REQUIRE(meta.ok());
  CHECK(meta.output == "['epoch'] array(-1.75, dtype=float32)\n");

  // Its listing piped to a reader that has gone (`| head -1`) ends quietly,
  // as cat's does: it ended in a BrokenPipeError traceback.
  std::string command;
  for (const auto& word : argv) command += "'" + word + "' ";
  const ProcessResult gone =
      run_process({"/bin/bash", "-c", command + "| true"}, std::chrono::seconds(120));
  CHECK_THAT(gone.output, !Contains("Error") && !Contains("Traceback"));

  // A corrupt file is refused by the script too.
  flip_bit(path, data_offset_of(path) + 5);
  const ProcessResult bad = run_process(argv, std::chrono::seconds(120));
  CHECK(bad.exit_code == 1);
  CHECK_THAT(bad.output, Contains("checksum"));
}

TEST_CASE("checkpoint: the numpy reader takes an empty tensor listed after its neighbour",
          "[checkpoint][python]") {
  const auto python = python_with_numpy();
  LOCKSTEP_SKIP_IF(python.empty() ? kNoNumpy : "");
  // Valid safetensors (its reader orders by (begin, end)): "a" holds no
  // bytes at the offset where "b" starts, and the header names "b" first.
  // The reader took "a" for a tensor starting too early.
  const std::string json = R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("a":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}})";
  const float b[2] = {1.5f, -2.0f};
  TempDir dir;
  const std::string path = dir.file("empty-after.safetensors");
  const std::string data(reinterpret_cast<const char*>(b), sizeof b);
  write_bytes(path, safetensors_bytes(json, data));
  const CheckpointContent c = load_checkpoint(path, {.require_checksum = false});
  REQUIRE(c.tensors.size() == 2);

  auto argv = python;
  argv.insert(argv.end(), {kScript, path});
  const ProcessResult r = run_process(argv, std::chrono::seconds(120));
  INFO(r.output);
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("a float32 [0, 3]\n") && Contains("b float32 [2]\n"));
}

TEST_CASE("checkpoint: the numpy reader refuses the headers lockstep refuses, with a message",
          "[checkpoint][python]") {
  const auto python = python_with_numpy();
  LOCKSTEP_SKIP_IF(python.empty() ? kNoNumpy : "");
  const std::string one = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  // A name given twice (json.loads kept the last one without a word), a
  // header that is not an object, and fewer tensor checksums than tensors
  // (both ended in a Python traceback).
  struct Case {
    std::string json;
    size_t data_bytes;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"{\"a\":" + one + ",\"a\":" + one + "}", 4, "names 'a' twice"},
      {"[1, 2]", 0, "not an object"},
      {R"({"__metadata__":{"lockstep.tensor_crc32":"00000000"},"a":)" + one +
           R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8, "1 checksums for 2 tensors"}};
  TempDir dir;
  for (const auto& [json, data_bytes, needle] : cases) {
    INFO(json);
    const std::string path = dir.file("bad.safetensors");
    write_bytes(path, safetensors_bytes(json, std::string(data_bytes, '\0')));
    CHECK_THROWS(load_checkpoint(path, {.require_checksum = false}));
    auto argv = python;
    argv.insert(argv.end(), {kScript, path});
    const ProcessResult r = run_process(argv, std::chrono::seconds(120));
    INFO(r.output);
    CHECK_FALSE(r.ok());
    CHECK_THAT(r.output, Contains("error: ") && Contains(needle));
    CHECK_THAT(r.output, !Contains("Traceback"));
  }
}
