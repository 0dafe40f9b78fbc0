#include "lockstep/runtime/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "lockstep/runtime/liveness.h"

namespace lockstep::runtime {

namespace {

constexpr size_t kChunk = size_t{1} << 16;
// MNIST uses 1 and 3 dimensions; a header claiming dozens is corrupt, and the
// cap keeps the header read tiny.
constexpr int kMaxDims = 8;

std::string dims_str(const Shape& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// The bytes of a file, inflated on the fly when it starts with the gzip magic
// (1f 8b). read() returns fewer bytes than asked only at the end of the data,
// so callers can report "expected N bytes, got M". The compressed input is
// streamed in fixed chunks: memory use is bounded by what the caller asks for,
// whatever the stream would inflate to.
class ByteSource {
 public:
  explicit ByteSource(const std::string& path) : path_(path), in_(kChunk) {
    errno = 0;
    file_.reset(std::fopen(path.c_str(), "rb"));
    if (!file_) {
      if (errno == ENOENT) throw Error(fmt::format("{}: no such file", path));
      throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    }
    struct stat st {};
    if (::fstat(::fileno(file_.get()), &st) == 0) {
      file_size_ = static_cast<uint64_t>(st.st_size);
      sized_ = S_ISREG(st.st_mode);
    }
    refill();
    gzip_ = avail_ >= 2 && next_[0] == 0x1f && next_[1] == 0x8b;
    if (gzip_) {
      // 15 + 16: the largest window, gzip wrapper only (a raw zlib stream is
      // not a format the datasets ship in).
      if (inflateInit2(&zs_, 15 + 16) != Z_OK)
        throw Error(fmt::format("{}: cannot initialise zlib", path));
      zs_init_ = true;
    }
  }
  ~ByteSource() {
    if (zs_init_) inflateEnd(&zs_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  bool gzip() const { return gzip_; }
  uint64_t file_size() const { return file_size_; }
  // Whether file_size() is what read() can give: a plain regular file.
  bool size_known() const { return sized_ && !gzip_; }

  // Why the data ended early, for error messages ("" if the file just ends).
  std::string short_reason() const {
    return truncated_ ? "; the gzip stream is cut off (the compressed file is truncated)" : "";
  }
  bool truncated() const { return truncated_; }

  size_t read(uint8_t* out, size_t n) { return gzip_ ? read_gzip(out, n) : read_plain(out, n); }

 private:
  // Reads the next chunk of the file; false at the end of the file.
  bool refill() {
    size_t n = std::fread(in_.data(), 1, in_.size(), file_.get());
    if (n == 0 && std::ferror(file_.get()))
      throw Error(fmt::format("{}: read error: {}", path_, std::strerror(errno)));
    next_ = in_.data();
    avail_ = n;
    consumed_ += n;
    return n > 0;
  }

  size_t read_plain(uint8_t* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      if (avail_ == 0 && !refill()) break;
      size_t k = std::min(n - got, avail_);
      std::memcpy(out + got, next_, k);
      next_ += k;
      avail_ -= k;
      got += k;
    }
    return got;
  }

  size_t read_gzip(uint8_t* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      if (avail_ == 0 && !refill()) {
        if (!member_ended_) truncated_ = true;
        break;
      }
      if (member_ended_) {
        // gzip allows several members back to back; anything else after a
        // complete member is garbage.
        if (next_[0] != 0x1f) {
          uint64_t offset = consumed_ - avail_;
          throw Error(fmt::format(
              "{}: corrupt gzip file: {} unexpected bytes after the end of the gzip "
              "stream at offset {}",
              path_, file_size_ > offset ? file_size_ - offset : avail_, offset));
        }
        inflateReset(&zs_);
        member_ended_ = false;
      }
      zs_.next_in = next_;
      zs_.avail_in = static_cast<uInt>(avail_);
      zs_.next_out = out + got;
      zs_.avail_out = static_cast<uInt>(std::min<size_t>(n - got, kChunk * 256));
      uInt before = zs_.avail_out;
      int ret = inflate(&zs_, Z_NO_FLUSH);
      got += before - zs_.avail_out;
      next_ = zs_.next_in;
      avail_ = zs_.avail_in;
      if (ret == Z_STREAM_END) {
        member_ended_ = true;
      } else if (ret == Z_MEM_ERROR) {
        throw Error(fmt::format("{}: out of memory while inflating", path_));
      } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
        // Z_BUF_ERROR only means "no progress possible now"; the loop refills
        // or stops. Anything else is a damaged stream.
        throw Error(fmt::format("{}: corrupt gzip stream: {}", path_,
                                zs_.msg ? zs_.msg : "zlib error " + std::to_string(ret)));
      }
    }
    return got;
  }

  std::string path_;
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  // Owned from the start: a constructor that throws (the path is a
  // directory) closes it too.
  std::unique_ptr<std::FILE, Close> file_;
  uint64_t file_size_ = 0;
  bool sized_ = false;  // a regular file: file_size_ is its length
  std::vector<uint8_t> in_;
  uint8_t* next_ = nullptr;  // unread input in in_
  size_t avail_ = 0;
  uint64_t consumed_ = 0;  // bytes read from the file so far
  bool gzip_ = false;
  z_stream zs_{};
  bool zs_init_ = false;
  bool member_ended_ = false;  // the last inflate() finished a gzip member
  bool truncated_ = false;     // the file ended inside a gzip member
};

bool known_type(uint8_t code) {
  switch (static_cast<IdxType>(code)) {
    case IdxType::u8:
    case IdxType::i8:
    case IdxType::i16:
    case IdxType::i32:
    case IdxType::f32:
    case IdxType::f64:
      return true;
  }
  return false;
}

// IDX elements are big-endian; convert in place to this machine's order.
void to_native_order(std::vector<uint8_t>& bytes, size_t elem) {
  if constexpr (std::endian::native == std::endian::little) {
    if (elem == 1) return;
    for (size_t i = 0; i + elem <= bytes.size(); i += elem)
      std::reverse(bytes.begin() + static_cast<ptrdiff_t>(i),
                   bytes.begin() + static_cast<ptrdiff_t>(i + elem));
  }
}

}  // namespace

std::string_view idx_type_name(IdxType t) {
  switch (t) {
    case IdxType::u8: return "u8";
    case IdxType::i8: return "i8";
    case IdxType::i16: return "i16";
    case IdxType::i32: return "i32";
    case IdxType::f32: return "f32";
    case IdxType::f64: return "f64";
  }
  return "?";
}

size_t idx_type_size(IdxType t) {
  switch (t) {
    case IdxType::u8:
    case IdxType::i8: return 1;
    case IdxType::i16: return 2;
    case IdxType::i32:
    case IdxType::f32: return 4;
    case IdxType::f64: return 8;
  }
  return 0;
}

namespace {

// Anything after the data means the header and the data disagree. Counts a
// bounded amount of it for the message.
void check_nothing_after(ByteSource& src, const std::string& name, uint64_t total,
                         const std::string& shape, IdxType type) {
  uint64_t extra = 0;
  uint8_t sink[4096];
  for (size_t n; extra < (uint64_t{1} << 20) && (n = src.read(sink, sizeof sink)) > 0;) extra += n;
  LOCKSTEP_CHECK(extra == 0,
                 "{}: trailing garbage: {}{} bytes after the {} data bytes that dims {} of {} "
                 "describe",
                 name, extra >= (uint64_t{1} << 20) ? "at least " : "", extra, total, shape,
                 idx_type_name(type));
  LOCKSTEP_CHECK(!src.truncated(),
                 "{}: corrupt gzip file: the file ends before the end of the gzip stream "
                 "(truncated download?)",
                 name);
}

}  // namespace

IdxArray read_idx(const std::string& path, const IdxReadOptions& options) {
  // Reading a file is progress, not a hang, however little CPU a slow
  // filesystem leaves it (runtime/liveness.h).
  const BusyScope reading;
  ByteSource src(path);
  const std::string name = src.gzip() ? path + " (gzip)" : path;

  uint8_t magic[4];
  size_t got = src.read(magic, 4);
  LOCKSTEP_CHECK(got > 0, "{}: {}, expected an IDX file{}", name,
                 src.gzip() ? "empty gzip stream" : "empty file", src.short_reason());
  LOCKSTEP_CHECK(got == 4,
                 "{}: truncated header: {} bytes, but an IDX file starts with a 4-byte magic{}",
                 name, got, src.short_reason());
  LOCKSTEP_CHECK(magic[0] == 0 && magic[1] == 0 && known_type(magic[2]),
                 "{}: wrong magic {:02x} {:02x} {:02x} {:02x}: not an IDX file (expected 00 00 "
                 "<type> <ndims> with type 08 u8, 09 i8, 0b i16, 0c i32, 0d f32 or 0e f64)",
                 name, magic[0], magic[1], magic[2], magic[3]);
  IdxArray array;
  array.type = static_cast<IdxType>(magic[2]);
  const int ndims = magic[3];
  LOCKSTEP_CHECK(ndims >= 1 && ndims <= kMaxDims,
                 "{}: wrong magic: {} dimensions (byte 4 of the magic); expected 1 to {}", name,
                 ndims, kMaxDims);

  uint8_t raw[4 * kMaxDims];
  const size_t dims_bytes = 4 * static_cast<size_t>(ndims);
  got = src.read(raw, dims_bytes);
  LOCKSTEP_CHECK(got == dims_bytes,
                 "{}: truncated header: {} dimensions need {} bytes after the magic, got {}{}",
                 name, ndims, dims_bytes, got, src.short_reason());

  // Total size, with every multiplication checked: dims are read from the
  // file, so their product must not be trusted to fit.
  const size_t elem = idx_type_size(array.type);
  uint64_t total = elem;
  bool overflow = false;
  for (int i = 0; i < ndims; ++i) {
    const uint8_t* p = raw + 4 * i;
    uint32_t d = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
    array.dims.push_back(d);
    overflow = overflow || __builtin_mul_overflow(total, uint64_t{d}, &total);
  }
  const std::string shape = dims_str(array.dims);
  for (int i = 0; i < ndims; ++i)
    LOCKSTEP_CHECK(array.dims[i] > 0, "{}: bad header: dimension {} of {} is 0", name, i, shape);
  LOCKSTEP_CHECK(!overflow, "{}: bad header: dims {} of {} overflow a 64-bit byte count", name,
                 shape, idx_type_name(array.type));
  LOCKSTEP_CHECK(total <= options.max_bytes,
                 "{}: bad header: dims {} of {} describe {} bytes, more than the limit of {} "
                 "(IdxReadOptions::max_bytes)",
                 name, shape, idx_type_name(array.type), total, options.max_bytes);

  // A prefix read takes the first rows only; `total` becomes their size.
  LOCKSTEP_CHECK(options.max_rows >= 1, "{}: IdxReadOptions::max_rows must be at least 1", name);
  const uint64_t rows = static_cast<uint64_t>(array.dims[0]);
  array.file_rows = array.dims[0];
  const bool prefix = rows > options.max_rows;
  if (prefix) {
    total = total / rows * options.max_rows;
    array.dims[0] = static_cast<int64_t>(options.max_rows);
  }

  const uint64_t header = 4 + dims_bytes;
  const auto check_have = [&](uint64_t have) {
    LOCKSTEP_CHECK(
        have == total,
        "{}: short data: dims {} of {} need {} bytes after the {}-byte header, got {}{}", name,
        prefix ? dims_str(array.dims) + " (the first rows of " + shape + ")" : shape,
        idx_type_name(array.type), total, header, have, src.short_reason());
  };
  // A plain file's length is known: one too short for its header is refused
  // before anything is allocated for what the header claims.
  if (src.size_known() && (src.file_size() < header || src.file_size() - header < total))
    check_have(src.file_size() > header ? src.file_size() - header : 0);
  const auto out_of_memory = [&] {
    return Error(fmt::format("{}: out of memory for the {} bytes of dims {} of {}", name, total,
                             shape, idx_type_name(array.type)));
  };
  // Reserve the claimed size (address space only: pages are committed when
  // written), then fill it a chunk at a time, so a file that lies about its
  // size costs the memory of what it holds, not of what it claims. A gzip
  // stream's size shows only as it inflates: where the reservation fails,
  // the vector grows with the data instead, and a short stream says so.
  try {
    array.bytes.reserve(total);
  } catch (const std::bad_alloc&) {
    if (src.size_known()) throw out_of_memory();
  }
  uint64_t have = 0;
  while (have < total) {
    uint64_t want = std::min(total - have, uint64_t{16} << 20);
    try {
      array.bytes.resize(have + want);
    } catch (const std::bad_alloc&) {
      throw out_of_memory();
    }
    size_t n = src.read(array.bytes.data() + have, want);
    have += n;
    if (n < want) break;
  }
  check_have(have);
  // A whole read checks that the file ends where the header says.
  if (!prefix) check_nothing_after(src, name, total, shape, array.type);

  to_native_order(array.bytes, elem);
  return array;
}

Tensor idx_to_tensor(const IdxArray& array) {
  const int64_t n = array.numel();
  LOCKSTEP_CHECK(array.bytes.size() == static_cast<size_t>(n) * idx_type_size(array.type),
                 "idx_to_tensor: {} bytes for dims {} of {}", array.bytes.size(),
                 dims_str(array.dims), idx_type_name(array.type));
  auto widen = [&]<class From>(From) {
    Tensor t = Tensor::empty(array.dims, DType::i32);
    int32_t* out = t.data_ptr<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      From v;
      std::memcpy(&v, array.bytes.data() + i * sizeof(From), sizeof(From));
      out[i] = v;
    }
    return t;
  };
  auto copy = [&](DType dtype) {
    Tensor t = Tensor::empty(array.dims, dtype);
    if (n > 0) std::memcpy(t.raw_data(), array.bytes.data(), array.bytes.size());
    return t;
  };
  switch (array.type) {
    case IdxType::u8: return copy(DType::u8);
    case IdxType::i8: return widen(int8_t{});
    case IdxType::i16: return widen(int16_t{});
    case IdxType::i32: return copy(DType::i32);
    case IdxType::f32: return copy(DType::f32);
    case IdxType::f64: return copy(DType::f64);
  }
  throw Error("idx_to_tensor: unknown IDX type");
}

}  // namespace lockstep::runtime
