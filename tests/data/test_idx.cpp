// IDX reader: round trips of plain and gzip files, every malformed-input error,
// and no crash (only lockstep::Error) on every truncation of a valid file.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <iterator>

#include "data_test_util.h"
#include "lockstep/runtime/data/idx.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

// 2 x 3 x 2 u8 values 0..11.
Bytes small_u8_idx() {
  Bytes data(12);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  return idx_file(0x08, {2, 3, 2}, data);
}

// Writes `bytes` (gzip-compressed if `gz`) and reads it back; returns the
// message of the error that read_idx throws.
std::string read_error(const Bytes& bytes, bool gz, const IdxReadOptions& options = {}) {
  TempDir dir;
  const std::string path = dir.file("f.idx");
  write_file(path, gz ? gzip(bytes) : bytes);
  return error_of([&] { read_idx(path, options); });
}

template <class T>
Bytes big_endian(const std::vector<T>& values) {
  Bytes out;
  for (T v : values) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    // The tests run on little-endian hosts: reversing gives big-endian.
    for (size_t i = 0; i < sizeof(T); ++i) out.push_back(b[sizeof(T) - 1 - i]);
  }
  return out;
}

}  // namespace

TEST_CASE("read_idx reads plain and gzip files alike", "[data][idx]") {
  const bool gz = GENERATE(false, true);
  // Compression is detected from the content: the name says the opposite.
  TempDir dir;
  const std::string path = dir.file(gz ? "images.idx" : "images.idx.gz");
  write_file(path, gz ? gzip(small_u8_idx()) : small_u8_idx());
  IdxArray a = read_idx(path);
  CHECK(a.type == IdxType::u8);
  CHECK(a.dims == Shape{2, 3, 2});
  CHECK(a.numel() == 12);
  REQUIRE(a.bytes.size() == 12);
  for (size_t i = 0; i < 12; ++i) CHECK(a.bytes[i] == i);
}

TEST_CASE("read_idx converts multi-byte elements from big-endian", "[data][idx]") {
  const bool gz = GENERATE(false, true);
  TempDir dir;
  const std::string path = dir.file("f.idx");
  auto write = [&](const Bytes& b) { write_file(path, gz ? gzip(b) : b); };

  write(idx_file(0x0B, {3}, big_endian<int16_t>({-2, 300, 7})));
  IdxArray a16 = read_idx(path);
  REQUIRE(a16.bytes.size() == 6);
  int16_t v16[3];
  std::memcpy(v16, a16.bytes.data(), 6);
  CHECK((v16[0] == -2 && v16[1] == 300 && v16[2] == 7));

  write(idx_file(0x0C, {2}, big_endian<int32_t>({-70000, 123456789})));
  IdxArray a32 = read_idx(path);
  int32_t v32[2];
  std::memcpy(v32, a32.bytes.data(), 8);
  CHECK((v32[0] == -70000 && v32[1] == 123456789));

  write(idx_file(0x0D, {1, 2}, big_endian<float>({1.5f, -0.25f})));
  IdxArray af = read_idx(path);
  CHECK(af.type == IdxType::f32);
  float vf[2];
  std::memcpy(vf, af.bytes.data(), 8);
  CHECK((vf[0] == 1.5f && vf[1] == -0.25f));

  write(idx_file(0x0E, {1}, big_endian<double>({3.25})));
  IdxArray ad = read_idx(path);
  double vd;
  std::memcpy(&vd, ad.bytes.data(), 8);
  CHECK(vd == 3.25);
}

TEST_CASE("read_idx accepts concatenated gzip members", "[data][idx]") {
  // gzip allows members back to back (`cat a.gz b.gz`); the data is their join.
  const Bytes whole = small_u8_idx();
  const Bytes first(whole.begin(), whole.begin() + 9);
  const Bytes second(whole.begin() + 9, whole.end());
  Bytes joined = gzip(first);
  const Bytes tail = gzip(second);
  joined.insert(joined.end(), tail.begin(), tail.end());
  TempDir dir;
  write_file(dir.file("f.gz"), joined);
  IdxArray a = read_idx(dir.file("f.gz"));
  CHECK(a.dims == Shape{2, 3, 2});
  CHECK(a.bytes == Bytes(whole.begin() + 16, whole.end()));
}

TEST_CASE("idx_to_tensor maps IDX types onto tensor dtypes", "[data][idx]") {
  TempDir dir;
  const std::string path = dir.file("f.idx");
  write_file(path, small_u8_idx());
  Tensor t = idx_to_tensor(read_idx(path));
  CHECK(t.dtype() == DType::u8);
  CHECK(t.shape() == Shape{2, 3, 2});
  CHECK(t.data_ptr<uint8_t>()[11] == 11);

  write_file(path, idx_file(0x09, {3}, {0xff, 0x80, 0x05}));  // i8: -1, -128, 5
  Tensor i8 = idx_to_tensor(read_idx(path));
  CHECK(i8.dtype() == DType::i32);
  CHECK(i8.to_vector<int32_t>() == std::vector<int32_t>{-1, -128, 5});

  write_file(path, idx_file(0x0B, {2}, big_endian<int16_t>({-300, 2})));
  CHECK(idx_to_tensor(read_idx(path)).to_vector<int32_t>() == std::vector<int32_t>{-300, 2});

  write_file(path, idx_file(0x0D, {2}, big_endian<float>({0.5f, 2.0f})));
  Tensor f = idx_to_tensor(read_idx(path));
  CHECK(f.dtype() == DType::f32);
  CHECK(f.to_vector<float>() == std::vector<float>{0.5f, 2.0f});
}

TEST_CASE("read_idx: a missing file names the path", "[data][idx]") {
  TempDir dir;
  const std::string path = dir.file("nope-idx3-ubyte.gz");
  const std::string msg = error_of([&] { read_idx(path); });
  CHECK_THAT(msg, Contains(path) && Contains("no such file"));
}

TEST_CASE("read_idx: a directory is refused, and its descriptor closed", "[data][idx]") {
  TempDir dir;
  const auto open_files = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                         std::filesystem::directory_iterator());
  };
  const auto before = open_files();
  for (int i = 0; i < 20; ++i) {
    const std::string msg = error_of([&] { read_idx(dir.str()); });
    CHECK_THAT(msg, Contains(dir.str()));
  }
  CHECK(open_files() == before);
}

TEST_CASE("read_idx: malformed headers", "[data][idx]") {
  const bool gz = GENERATE(false, true);
  INFO((gz ? "gzip" : "plain"));

  CHECK_THAT(read_error({}, gz), Contains(gz ? "empty gzip stream" : "empty file"));
  // Cut inside the magic and inside the dims, at several points.
  const Bytes ok = small_u8_idx();  // header: 4 + 3 * 4 = 16 bytes
  for (size_t cut : {1, 2, 3}) {
    INFO("cut at " << cut);
    CHECK_THAT(read_error(Bytes(ok.begin(), ok.begin() + cut), gz),
               Contains("truncated header") && Contains("4-byte magic"));
  }
  for (size_t cut : {4, 5, 8, 15}) {
    INFO("cut at " << cut);
    CHECK_THAT(read_error(Bytes(ok.begin(), ok.begin() + cut), gz),
               Contains("truncated header") && Contains("3 dimensions need 12 bytes"));
  }

  Bytes bad = ok;
  bad[0] = 0x01;
  CHECK_THAT(read_error(bad, gz), Contains("wrong magic 01 00 08 03"));
  bad = ok;
  bad[2] = 0x07;  // no such element type
  CHECK_THAT(read_error(bad, gz), Contains("wrong magic 00 00 07 03"));
  // A text file is not an IDX file.
  const std::string text = "hello, world\n";
  CHECK_THAT(read_error(Bytes(text.begin(), text.end()), gz), Contains("wrong magic 68 65 6c 6c"));
  bad = ok;
  bad[3] = 0;  // no dimensions
  CHECK_THAT(read_error(bad, gz), Contains("wrong magic") && Contains("0 dimensions"));
  bad[3] = 200;
  CHECK_THAT(read_error(bad, gz), Contains("200 dimensions"));
}

TEST_CASE("read_idx rejects zero and overflowing dims and dims over the limit", "[data][idx]") {
  const bool gz = GENERATE(false, true);
  INFO((gz ? "gzip" : "plain"));
  CHECK_THAT(read_error(idx_file(0x08, {3, 0, 2}, {}), gz),
             Contains("dimension 1 of [3, 0, 2] is 0"));
  const uint32_t big = 0xffffffffu;
  CHECK_THAT(read_error(idx_file(0x0E, {big, big, big}, {}), gz),
             Contains("overflow") && Contains("f64"));
  CHECK_THAT(read_error(idx_file(0x08, {big, big}, {}), gz),
             Contains("more than the limit") && Contains("max_bytes"));
  // The limit is the caller's to choose.
  CHECK_THAT(read_error(small_u8_idx(), gz, {.max_bytes = 11}),
             Contains("describe 12 bytes, more than the limit of 11"));
}

TEST_CASE("read_idx: short data and trailing garbage", "[data][idx]") {
  const bool gz = GENERATE(false, true);
  INFO((gz ? "gzip" : "plain"));
  const Bytes ok = small_u8_idx();  // 16-byte header + 12 data bytes
  for (size_t have : {0, 1, 5, 11}) {
    INFO("data bytes " << have);
    const std::string msg = read_error(Bytes(ok.begin(), ok.begin() + 16 + have), gz);
    CHECK_THAT(msg, Contains("short data") && Contains("need 12 bytes") &&
                        Contains("got " + std::to_string(have)));
  }
  Bytes longer = ok;
  longer.insert(longer.end(), {9, 9, 9});
  CHECK_THAT(read_error(longer, gz),
             Contains("trailing garbage: 3 bytes after the 12 data bytes"));
  // Far more than the header says: the count is capped, not read to the end.
  Bytes huge = ok;
  huge.resize(ok.size() + (3 << 20), 0);
  CHECK_THAT(read_error(huge, gz), Contains("trailing garbage: at least"));
}

TEST_CASE("read_idx with max_rows reads the first rows and stops there", "[data][idx]") {
  const bool gz = GENERATE(false, true);
  INFO((gz ? "gzip" : "plain"));
  TempDir dir;
  // Row 1 is cut short and followed by garbage: a prefix read of row 0 never
  // gets there, a whole read fails.
  Bytes damaged = small_u8_idx();
  damaged.resize(damaged.size() - 2);
  damaged.insert(damaged.end(), {7, 7, 7, 7, 7});
  const std::string path = dir.file("f.idx");
  write_file(path, gz ? gzip(damaged) : damaged);
  IdxArray first = read_idx(path, {.max_rows = 1});
  CHECK(first.dims == Shape{1, 3, 2});
  CHECK(first.file_rows == 2);
  REQUIRE(first.bytes.size() == 6);
  for (size_t i = 0; i < 6; ++i) CHECK(first.bytes[i] == i);
  CHECK_THAT(error_of([&] { read_idx(path); }), Contains("trailing garbage"));

  // As many rows as the file holds or more: the whole file, checked as such.
  write_file(path, gz ? gzip(small_u8_idx()) : small_u8_idx());
  for (uint64_t rows : {2, 3, 1000}) {
    IdxArray a = read_idx(path, {.max_rows = rows});
    CHECK(a.dims == Shape{2, 3, 2});
    CHECK(a.file_rows == 2);
    CHECK(a.bytes.size() == 12);
  }
  // Multi-byte elements are converted in a prefix read too.
  write_file(path, idx_file(0x0C, {3}, big_endian<int32_t>({-5, 70000, 1})));
  IdxArray ints = read_idx(path, {.max_rows = 2});
  REQUIRE(ints.bytes.size() == 8);
  int32_t v[2];
  std::memcpy(v, ints.bytes.data(), 8);
  CHECK(v[0] == -5);
  CHECK(v[1] == 70000);
  // A prefix still needs its rows; the header is checked as for a whole read.
  const Bytes whole = small_u8_idx();
  const Bytes short_data(whole.begin(), whole.begin() + 16 + 4);
  CHECK_THAT(read_error(short_data, gz, {.max_rows = 1}),
             Contains("short data") && Contains("the first rows of [2, 3, 2]") &&
                 Contains("got 4"));
  CHECK_THAT(read_error(whole, gz, {.max_bytes = 11, .max_rows = 1}),
             Contains("more than the limit of 11"));
  CHECK_THAT(read_error(whole, gz, {.max_rows = 0}), Contains("max_rows must be at least 1"));
}

TEST_CASE("read_idx: damaged gzip streams", "[data][idx]") {
  const Bytes ok = small_u8_idx();
  const Bytes z = gzip(ok);
  REQUIRE(z.size() > 20);
  TempDir dir;
  const std::string path = dir.file("f.gz");
  auto error_for = [&](const Bytes& file) {
    write_file(path, file);
    return error_of([&] { read_idx(path); });
  };

  // Cut inside the gzip header, inside the deflate data, inside the trailer.
  CHECK_THAT(error_for(Bytes(z.begin(), z.begin() + 5)),
             Contains("empty gzip stream") && Contains("gzip stream is cut off"));
  CHECK_THAT(error_for(Bytes(z.begin(), z.begin() + 14)), Contains("gzip stream is cut off"));
  CHECK_THAT(error_for(Bytes(z.begin(), z.end() - 3)),
             Contains("ends before the end of the gzip stream"));

  Bytes bad = z;
  bad[2] = 7;  // compression method: only 8 (deflate) exists
  CHECK_THAT(error_for(bad), Contains("corrupt gzip stream") && Contains("compression method"));
  bad = z;
  bad[10] = 0x07;  // first deflate block: final, type 3 (reserved)
  CHECK_THAT(error_for(bad), Contains("corrupt gzip stream") && Contains("block type"));
  bad = z;
  bad[z.size() - 8] ^= 0xff;  // CRC-32 of the data
  CHECK_THAT(error_for(bad), Contains("corrupt gzip stream") && Contains("data check"));
  bad = z;
  bad[z.size() - 1] ^= 0x01;  // ISIZE, the data length mod 2^32
  CHECK_THAT(error_for(bad), Contains("corrupt gzip stream") && Contains("length check"));
  bad = z;
  bad.insert(bad.end(), {'j', 'u', 'n', 'k'});
  CHECK_THAT(error_for(bad), Contains("4 unexpected bytes after the end of the gzip stream"));
}

TEST_CASE("read_idx: every truncation and byte flip gives a lockstep::Error or data",
          "[data][idx]") {
  // The reader must never crash or throw anything else on a damaged file; run
  // under a sanitizer this also checks that it never reads out of bounds.
  const Bytes ok = idx_file(0x0B, {2, 3}, big_endian<int16_t>({1, 2, 3, 4, 5, 6}));
  const bool gz = GENERATE(false, true);
  const Bytes file = gz ? gzip(ok) : ok;
  TempDir dir;
  const std::string path = dir.file("f");
  auto outcome = [&](const Bytes& b) {
    write_file(path, b);
    try {
      read_idx(path);
      return std::string("ok");
    } catch (const lockstep::Error&) {
      return std::string("error");
    } catch (const std::exception& e) {
      return std::string("other exception: ") + e.what();
    }
  };
  for (size_t cut = 0; cut < file.size(); ++cut) {
    INFO("cut at " << cut);
    CHECK(outcome(Bytes(file.begin(), file.begin() + cut)) == "error");
  }
  for (size_t i = 0; i < file.size(); ++i) {
    Bytes bad = file;
    bad[i] ^= 0x5a;
    INFO("flipped byte " << i);
    CHECK_THAT(outcome(bad), !Contains("other exception"));
  }
}
