// Damaged and mismatched checkpoints are refused with errors that name the
// file, what is wrong (and where), and what to do.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/checkpoint_test_util.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

std::string saved(const TempDir& dir, const std::string& name = "c.safetensors") {
  const std::string path = dir.file(name);
  save_checkpoint(path, small_content());
  return path;
}

std::string load_error(const std::string& path) {
  return error_of([&] { load_checkpoint(path); });
}

// A file of the safetensors header `json` (padded) and `data_bytes` zero bytes.
void write_header(const std::string& path, std::string json, uint64_t data_bytes) {
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(file.data(), &n, 8);
  write_bytes(path, file + json + std::string(data_bytes, '\0'));
}

}  // namespace

TEST_CASE("checkpoint: truncated files are rejected at every cut point", "[checkpoint]") {
  TempDir dir;
  const std::string path = saved(dir);
  const uint64_t size = std::filesystem::file_size(path);
  const uint64_t data = data_offset_of(path);

  struct Cut {
    const char* where;
    uint64_t size;
    const char* says;
  };
  const Cut cut =
      GENERATE_COPY(Cut{"empty file", 0, "shorter than the 8-byte"},
                    Cut{"inside the length prefix", 5, "shorter than the 8-byte"},
                    Cut{"right after the length prefix", 8, "truncated"},
                    Cut{"inside the header", data / 2, "truncated"},
                    Cut{"at the end of the header", data, "truncated"},
                    Cut{"inside the first tensor", data + 100, "from tensor 'fc1.weight'"},
                    Cut{"one byte short", size - 1, "1 bytes missing"});
  INFO(cut.where);
  std::filesystem::resize_file(path, cut.size);
  const std::string err = load_error(path);
  CHECK_THAT(err, Contains(path) && Contains(cut.says));
  if (cut.size >= 8) CHECK_THAT(err, Contains("truncated"));
}

TEST_CASE("checkpoint: trailing bytes are rejected", "[checkpoint]") {
  TempDir dir;
  const std::string path = saved(dir);
  write_bytes(path, read_bytes(path) + "junk");
  CHECK_THAT(load_error(path), Contains("4 unexpected bytes after the data"));
}

TEST_CASE("checkpoint: a bit flip in the data names the tensor", "[checkpoint]") {
  TempDir dir;
  const std::string path = saved(dir);
  const uint64_t data = data_offset_of(path);
  // fc1.weight: 512 bytes, fc1.bias: 64 bytes, fc2.weight next.
  flip_bit(path, data + 512 + 64 + 10, 3);
  const std::string err = load_error(path);
  CHECK_THAT(err, Contains(path) && Contains("tensor 'fc2.weight'") &&
                      Contains("fails its checksum") && Contains("use an older checkpoint"));
}

TEST_CASE("checkpoint: a tensor damaged into the bytes of another is corrupt rather than moved",
          "[checkpoint]") {
  // A LayerNorm's weight zeroed on disk now holds its bias's bytes, and so
  // its checksum: the file is damaged, not saved again in another order.
  TempDir dir;
  const std::string path = dir.file("ln.safetensors");
  save_checkpoint(path, {.tensors = {{"ln.weight", Tensor::ones({8})},
                                     {"ln.bias", Tensor::zeros({8})},
                                     {"head.weight", random_tensor({4, 8}, DType::f32)}}});
  std::string bytes = read_bytes(path);
  std::memset(bytes.data() + data_offset_of(path), 0, 32);
  write_bytes(path, bytes);
  const std::string err = load_error(path);
  CHECK_THAT(err, Contains("tensor 'ln.weight'") && Contains("fails its checksum") &&
                      Contains("use an older checkpoint"));
  CHECK_THAT(err, !Contains("another order") && !Contains("leave lockstep.checksum"));
}

TEST_CASE("checkpoint: a bit flip in the header is caught", "[checkpoint]") {
  TempDir dir;
  const std::string path = saved(dir);
  const std::string json = read_bytes(path).substr(8, data_offset_of(path) - 8);

  SECTION("in a tensor name: still valid JSON, only the checksum sees it") {
    flip_bit(path, 8 + json.find("fc2.weight") + 1, 0);  // 'c' -> 'b'
    CHECK_THAT(load_error(path), Contains("checksum mismatch") && Contains("header was altered"));
  }
  SECTION("in a shape: the byte count no longer matches") {
    flip_bit(path, 8 + json.find("[16,8]") + 4, 0);  // 8 -> 9
    CHECK_THAT(load_error(path),
               Contains(path) && Contains("tensor 'fc1.weight'") && Contains("needs 576 bytes"));
  }
  SECTION("in the JSON syntax") {
    flip_bit(path, 8 + json.find("[16,8]") + 4, 1);  // 8 -> :
    CHECK_THAT(load_error(path), Contains(path) && Contains("not valid JSON"));
  }
  SECTION("in the metadata") {
    flip_bit(path, 8 + json.find("mlp"), 1);
    CHECK_THAT(load_error(path), Contains("checksum mismatch"));
  }
  SECTION("in the stored checksum itself") {
    flip_bit(path, 8 + json.find("crc32:") + 8, 0);
    CHECK_THAT(load_error(path), Contains(path));
  }
}

TEST_CASE("checkpoint: a file saved again by another program with our checksums says so",
          "[checkpoint]") {
  // As Python's safetensors saves the tensors and metadata read from a
  // checkpoint: its own tensor order and header, our checksums copied along.
  TempDir dir;
  const std::string path = saved(dir);
  const SafetensorsFile read = read_safetensors(path);
  const auto save_again = [&](const NamedTensors& tensors,
                              std::map<std::string, std::string> metadata) {
    std::vector<TensorEntry> entries;
    std::string data;
    for (const auto& [name, t] : tensors) {
      entries.push_back({.name = name, .dtype = t.dtype(), .shape = t.shape()});
      data += bytes_of(t);
    }
    write_bytes(path, encode_safetensors_header(entries, metadata) + data);
  };

  save_again({read.tensors.rbegin(), read.tensors.rend()}, read.metadata);
  CHECK_THAT(load_error(path), Contains("in another order than when lockstep wrote them") &&
                                   Contains("leave lockstep.checksum and lockstep.tensor_crc32 "
                                            "out of the metadata when saving it again"));
  // safetensors' save_model keeps one name of a tied weight: one tensor fewer.
  save_again({read.tensors.begin(), read.tensors.end() - 1}, read.metadata);
  CHECK_THAT(load_error(path), Contains("lists 4 checksums for 3 tensors") &&
                                   Contains("saved again by another program") &&
                                   Contains("leave lockstep.checksum"));
  auto format_pt = read.metadata;
  format_pt["format"] = "pt";
  save_again(read.tensors, format_pt);
  CHECK_THAT(load_error(path), Contains("header was altered") &&
                                   Contains("written again by another program") &&
                                   Contains("leave lockstep.checksum"));

  // Without them, it loads.
  format_pt.erase(kChecksumKey);
  format_pt.erase(kTensorChecksumsKey);
  save_again({read.tensors.rbegin(), read.tensors.rend()}, format_pt);
  CHECK(load_checkpoint(path, {.require_checksum = false}).tensors.size() == 4);
}

TEST_CASE("checkpoint: a wrong length prefix is refused", "[checkpoint]") {
  TempDir dir;
  const std::string path = saved(dir);
  std::string bytes = read_bytes(path);

  SECTION("not a safetensors file at all") {
    write_bytes(path, "PK\x03\x04 this is a zip file, or anything else entirely");
    CHECK_THAT(load_error(path), Contains("more than safetensors allows"));
  }
  SECTION("an oversized header length") {
    const uint64_t n = uint64_t{1} << 40;
    std::memcpy(bytes.data(), &n, 8);
    write_bytes(path, bytes);
    CHECK_THAT(load_error(path), Contains("more than safetensors allows"));
  }
  SECTION("a length that runs past the end of the file") {
    const uint64_t n = bytes.size();
    std::memcpy(bytes.data(), &n, 8);
    write_bytes(path, bytes);
    CHECK_THAT(load_error(path), Contains("truncated: the header length field"));
  }
  SECTION("a length that cuts the JSON short") {
    const uint64_t n = 16;
    std::memcpy(bytes.data(), &n, 8);
    write_bytes(path, bytes);
    CHECK_THAT(load_error(path), Contains("not valid JSON"));
  }
}

TEST_CASE("checkpoint: headers that parse but lie are refused", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("lie.safetensors");
  auto write_json = [&](const std::string& json, uint64_t data_bytes) {
    write_header(path, json, data_bytes);
  };
  auto err = [&] { return error_of([&] { load_checkpoint(path, {.require_checksum = false}); }); };

  write_json(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12);
  CHECK_THAT(err(), Contains("tensor 'w'") && Contains("needs 16 bytes"));
  write_json(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  CHECK_THAT(err(), Contains("starts at data byte 4, expected 0"));
  write_json(R"({"w":{"dtype":"I16","shape":[1],"data_offsets":[0,2]}})", 2);
  CHECK_THAT(err(), Contains("dtype I16, which lockstep does not support"));
  write_json(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
  CHECK_THAT(err(), Contains("not a size"));
  write_json(R"([1,2,3])", 0);
  CHECK_THAT(err(), Contains("not a JSON object"));
  write_json(R"({"__metadata__":{"n":1}})", 0);
  CHECK_THAT(err(), Contains("metadata 'n'"));
  write_json(R"({"b":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})", 0);
  write_bytes(path, read_bytes(path) + "\x07");
  CHECK_THAT(err(), Contains("bool tensor 'b' holds bytes other than 0 and 1"));
}

TEST_CASE("checkpoint: a header naming something twice, or holding a NUL byte, is refused",
          "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("odd.safetensors");
  auto err = [&] { return error_of([&] { load_checkpoint(path, {.require_checksum = false}); }); };

  write_header(path,
               R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
               R"("w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               12);
  CHECK_THAT(err(), Contains("names \"w\" twice") && Contains(path));
  write_header(path, R"({"__metadata__":{"k":"a","k":"b"}})", 0);
  CHECK_THAT(err(), Contains("has a key \"k\" twice"));
  write_header(path, R"({"w":{"dtype":"F32","dtype":"F64","shape":[1],"data_offsets":[0,4]}})", 4);
  CHECK_THAT(err(), Contains("has a key \"dtype\" twice"));
  write_header(path, R"({"__metadata__":{"k":"a"},"__metadata__":{"k":"b"}})", 0);
  CHECK_THAT(err(), Contains("names \"__metadata__\" twice"));

  write_header(path, std::string("{}\0junk", 7), 0);
  CHECK_THAT(err(), Contains("NUL byte at byte 10"));

  // The same key in two objects is no duplicate; a NUL written \u0000 in a
  // string is no NUL byte.
  write_header(path,
               R"({"__metadata__":{"dtype":"x\u0000y"},)"
               R"("dtype":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
               4);
  const CheckpointContent ok = load_checkpoint(path, {.require_checksum = false});
  CHECK(ok.metadata.at("dtype") == std::string("x\0y", 3));
  CHECK(ok.tensors.at(0).first == "dtype");
}

TEST_CASE("checkpoint: a header of thousands of tensors keeps their document order, empty "
          "tensors at a shared offset included, and refuses a key twice in any object",
          "[checkpoint]") {
  // The names run against their sorted order, and tensors come in pairs of
  // empty ones, each pair at one offset: only the document's order says which
  // of the two comes first.
  TempDir dir;
  const std::string path = dir.file("many.safetensors");
  const int n = 3000;
  std::vector<std::string> names;
  std::string json = R"({"__metadata__":{"z":"1","a":"2"})";
  uint64_t offset = 0;
  for (int i = 0; i < n; ++i) {
    names.push_back(fmt::format("t{:04}", n - 1 - i));
    const uint64_t bytes = i % 4 < 2 ? 0 : 4;
    json += fmt::format(R"(,"{}":{{"dtype":"F32","shape":[{}],"data_offsets":[{},{}]}})",
                        names.back(), bytes / 4, offset, offset + bytes);
    offset += bytes;
  }
  write_header(path, json + "}", offset);
  const CheckpointContent back = load_checkpoint(path, {.require_checksum = false});
  REQUIRE(back.tensors.size() == names.size());
  for (int i = 0; i < n; ++i) CHECK(back.tensors[i].first == names[i]);
  CHECK(back.metadata == std::map<std::string, std::string>{{"a", "2"}, {"z", "1"}});

  // A key twice inside an object within an array, and a tensor's name twice
  // far apart, are each refused.
  write_header(path, R"({"w":{"dtype":"F32","shape":[{"k":1,"k":2}],"data_offsets":[0,4]}})", 4);
  CHECK_THAT(error_of([&] { load_checkpoint(path, {.require_checksum = false}); }),
             Contains("has a key \"k\" twice"));
  write_header(path, json + "," + json.substr(json.find(R"("t2999")")) + "}", offset);
  CHECK_THAT(error_of([&] { load_checkpoint(path, {.require_checksum = false}); }),
             Contains("names \"t2999\" twice"));
  write_header(path, json + ",", offset);
  CHECK_THAT(error_of([&] { load_checkpoint(path, {.require_checksum = false}); }),
             Contains("is not valid JSON"));
}

TEST_CASE("checkpoint: a null __metadata__ reads as no metadata, as safetensors' reader takes it",
          "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("null.safetensors");
  write_header(path,
               R"({"__metadata__":null,"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  const CheckpointContent ok = load_checkpoint(path, {.require_checksum = false});
  CHECK(ok.metadata.empty());
  REQUIRE(ok.tensors.size() == 1);
  CHECK(ok.tensors.at(0).first == "w");

  write_header(path, R"({"__metadata__":[1]})", 0);
  CHECK_THAT(error_of([&] { load_checkpoint(path, {.require_checksum = false}); }),
             Contains("\"__metadata__\" in the safetensors header is [1], not an object"));
}

TEST_CASE("checkpoint: a missing file is reported as such", "[checkpoint]") {
  TempDir dir;
  CHECK_THAT(load_error(dir.file("nope.safetensors")), Contains("nope.safetensors: no such file"));
}

TEST_CASE("checkpoint: check_tensors_match lists every difference", "[checkpoint]") {
  NamedTensors found = small_content().tensors;
  NamedTensors expected = found;
  CHECK_NOTHROW(check_tensors_match(found, expected, "c.safetensors"));

  expected[0].second = Tensor::zeros({16, 9});                 // shape differs
  expected[1].second = Tensor::zeros({16}, DType::bf16);       // dtype differs
  expected.emplace_back("fc3.weight", Tensor::zeros({2, 2}));  // missing from the file
  expected.erase(expected.begin() + 2);                        // fc2.weight unexpected
  const std::string err = error_of([&] { check_tensors_match(found, expected, "c.safetensors"); });
  CHECK_THAT(err, Contains("c.safetensors does not match"));
  CHECK_THAT(err, Contains("'fc1.weight': expected f32 [16, 9], found f32 [16, 8]"));
  CHECK_THAT(err, Contains("'fc1.bias': expected bf16 [16], found f32 [16]"));
  CHECK_THAT(err, Contains("missing from the file: 'fc3.weight'"));
  CHECK_THAT(err, Contains("in the file but not expected: 'fc2.weight'"));
  CHECK_THAT(err, Contains("different model"));
}

TEST_CASE("checkpoint: a model converted to another dtype after the save is told to convert back",
          "[checkpoint]") {
  NamedTensors found = small_content().tensors;
  NamedTensors expected = found;
  for (auto& [name, t] : expected) t = Tensor::zeros(t.shape(), DType::bf16);
  const std::string err = error_of([&] { check_tensors_match(found, expected, "c.safetensors"); });
  CHECK_THAT(err, Contains("'fc1.bias': expected bf16 [16], found f32 [16]"));
  CHECK_THAT(err, Contains("Only dtypes differ: the checkpoint was saved from the model in f32"));
  CHECK_THAT(err, Contains("Module::to"));
  CHECK_THAT(err, !Contains("different model"));
}
