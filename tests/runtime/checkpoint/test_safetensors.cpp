// The safetensors file layer: round trips of every dtype and odd shapes,
// non-contiguous input, metadata, the header layout other readers rely on,
// and the writer's refusals.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "lockstep/runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/checkpoint_test_util.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

TEST_CASE("checkpoint: every dtype round-trips bit for bit", "[checkpoint]") {
  const DType dt = GENERATE(DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64,
                            DType::u8, DType::boolean);
  INFO(dtype_name(dt));
  TempDir dir;
  CheckpointContent c;
  c.tensors = {{"matrix", random_tensor({3, 5}, dt, 7)},
               {"scalar", random_tensor({}, dt, 8)},
               {"empty", random_tensor({0, 4}, dt, 9)},
               {"big", random_tensor({1 << 19}, dt, 10)}};  // crosses the write chunk size
  save_checkpoint(dir.file("a.safetensors"), c);

  CheckpointContent back = load_checkpoint(dir.file("a.safetensors"));
  REQUIRE(back.tensors.size() == c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    INFO(c.tensors[i].first);
    CHECK(back.tensors[i].first == c.tensors[i].first);
    CHECK(same_tensor(back.tensors[i].second, c.tensors[i].second));
    CHECK(back.tensors[i].second.is_contiguous());
    CHECK(back.tensors[i].second.device() == Device::cpu());
  }
  CHECK(back.tensors[1].second.dim() == 0);
  CHECK(back.tensors[2].second.shape() == Shape{0, 4});
}

TEST_CASE("checkpoint: metadata and tensor order survive, checksum keys are dropped",
          "[checkpoint]") {
  TempDir dir;
  CheckpointContent c = small_content();
  c.metadata["quote\"and\\slash"] = "line\nbreak, unicode \xc3\xa9";
  c.tensors.emplace_back("a.first.in.name.order.but.last", random_tensor({2}, DType::f32));
  save_checkpoint(dir.file("m.safetensors"), c);

  CheckpointContent back = load_checkpoint(dir.file("m.safetensors"));
  CHECK(back.metadata == c.metadata);
  REQUIRE(back.tensors.size() == c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) CHECK(back.tensors[i].first == c.tensors[i].first);

  // The raw file layer still shows the checksums.
  SafetensorsFile raw = read_safetensors(dir.file("m.safetensors"));
  CHECK(raw.metadata.at(kChecksumKey).rfind("crc32:", 0) == 0);
  CHECK(raw.metadata.count(kTensorChecksumsKey) == 1);
}

TEST_CASE("checkpoint: non-contiguous tensors are written contiguously", "[checkpoint]") {
  TempDir dir;
  Tensor base = random_tensor({6, 4}, DType::f64, 3);
  CheckpointContent c;
  c.tensors = {{"transposed", base.t()},
               {"strided", base.slice(0, 1, 6, 2)},
               {"expanded", random_tensor({1, 4}, DType::f32).expand({3, 4})}};
  save_checkpoint(dir.file("nc.safetensors"), c);
  CheckpointContent back = load_checkpoint(dir.file("nc.safetensors"));
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    INFO(c.tensors[i].first);
    CHECK(same_tensor(back.tensors[i].second, c.tensors[i].second));
  }
}

TEST_CASE("checkpoint: header layout is standard safetensors", "[checkpoint]") {
  TempDir dir;
  save_checkpoint(dir.file("h.safetensors"), small_content());
  const std::string bytes = read_bytes(dir.file("h.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);  // data 8-byte aligned
  CHECK(bytes[8] == '{');
  const std::string json = bytes.substr(8, n);
  CHECK_THAT(
      json,
      Contains("\"fc1.weight\":{\"dtype\":\"F32\",\"shape\":[16,8],\"data_offsets\":[0,512]}"));
  CHECK_THAT(json, Contains("\"step_count\":{\"dtype\":\"I64\",\"shape\":[],"));
  CHECK_THAT(json, Contains("\"__metadata__\":{"));

  SafetensorsHeader h = read_safetensors_header(dir.file("h.safetensors"));
  CHECK(h.file_bytes() == bytes.size());
  CHECK(h.tensors.front().begin == 0);
  CHECK(h.tensors.back().end == bytes.size() - 8 - n);
}

TEST_CASE("checkpoint: a plain safetensors file loads only when checksums are optional",
          "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("plain.safetensors");
  Tensor t = random_tensor({2, 3}, DType::f32, 5);
  std::string file = encode_safetensors_header(
      {{.name = "w", .dtype = DType::f32, .shape = {2, 3}}}, {{"format", "pt"}});
  file += bytes_of(t);
  write_bytes(path, file);

  CHECK_THAT(error_of([&] { load_checkpoint(path); }),
             Contains("no 'lockstep.checksum'") && Contains("require_checksum = false"));
  CheckpointContent back = load_checkpoint(path, {.require_checksum = false});
  REQUIRE(back.tensors.size() == 1);
  CHECK(same_tensor(back.tensors[0].second, t));
  CHECK(back.metadata.at("format") == "pt");
}

TEST_CASE("checkpoint: the writer refuses bad input and leaves no file", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  CheckpointContent dup;
  dup.tensors = {{"w", Tensor::zeros({2})}, {"w", Tensor::zeros({3})}};
  CHECK_THAT(error_of([&] { save_checkpoint(path, dup); }), Contains("'w' appears twice"));

  CheckpointContent reserved = small_content();
  reserved.metadata[kChecksumKey] = "crc32:00000000";
  CHECK_THAT(error_of([&] { save_checkpoint(path, reserved); }), Contains("reserved"));

  CheckpointContent undefined;
  undefined.tensors = {{"u", Tensor()}};
  CHECK_THAT(error_of([&] { save_checkpoint(path, undefined); }), Contains("'u' is undefined"));

  // Nothing left behind: no target, no temporary file.
  CHECK(std::filesystem::is_empty(dir.str()));
}

TEST_CASE("checkpoint: saving over an existing file replaces it", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  save_checkpoint(path, small_content(1));
  CheckpointContent second = small_content(2);
  save_checkpoint(path, second);
  CHECK(same_tensor(load_checkpoint(path).tensors[0].second, second.tensors[0].second));
  CHECK(std::distance(std::filesystem::directory_iterator(dir.str()), {}) == 1);
}

TEST_CASE("checkpoint: save reports progress up to the file size", "[checkpoint]") {
  TempDir dir;
  CheckpointContent c;
  c.tensors = {{"w", random_tensor({3 << 20}, DType::f32)}};  // 12 MB: several writes
  uint64_t last = 0, total = 0;
  int calls = 0;
  const uint64_t size = save_checkpoint(dir.file("p.safetensors"), c,
                                        {.on_progress = [&](uint64_t done, uint64_t all) {
                                          CHECK(done > last);
                                          last = done;
                                          total = all;
                                          ++calls;
                                        }});
  CHECK(calls >= 3);
  CHECK(last == size);
  CHECK(total == size);
  CHECK(size == std::filesystem::file_size(dir.file("p.safetensors")));
}

TEST_CASE("checkpoint: write_safetensors to a path writes the file save_checkpoint writes",
          "[checkpoint]") {
  TempDir dir;
  const CheckpointContent c = small_content(3);
  const std::string by_path = dir.file("by_path.safetensors");
  const std::string by_save = dir.file("by_save.safetensors");
  const uint64_t bytes = write_safetensors(std::filesystem::path(by_path), c.tensors, c.metadata);
  CHECK(bytes == save_checkpoint(by_save, c));
  CHECK(read_bytes(by_path) == read_bytes(by_save));
  // Over an existing file, and with nothing left beside it.
  write_safetensors(std::filesystem::path(by_path), small_content(4).tensors, {});
  CHECK(same_tensor(load_checkpoint(by_path).tensors[0].second,
                    small_content(4).tensors[0].second));
  CHECK(std::distance(std::filesystem::directory_iterator(dir.str()), {}) == 2);
}
