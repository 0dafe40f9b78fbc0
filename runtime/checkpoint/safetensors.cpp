#include "lockstep/runtime/checkpoint/safetensors.h"

#include <fcntl.h>
#include <zlib.h>
#if LOCKSTEP_HAVE_DEFLATE
#include <libdeflate.h>
#endif

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <optional>

#include "lockstep/runtime/checkpoint/atomic_file.h"
#include "lockstep/runtime/checkpoint/file_io.h"

namespace lockstep::runtime {

namespace {

// Large tensors go to write() in pieces of this size: each piece is read once
// for its CRC and then copied into the page cache while still in the CPU cache.
constexpr size_t kChunk = size_t{4} << 20;
// Smaller tensors are gathered into one buffer of kChunk bytes, so a model of
// many small parameters still makes few, large writes.
constexpr size_t kGatherBelow = size_t{256} << 10;
// Every this many bytes the writer asks the kernel to start writing the pages
// back (Linux sync_file_range): the disk works while we compute CRCs and copy,
// instead of all of it waiting for the final fsync.
constexpr uint64_t kWritebackEvery = uint64_t{32} << 20;

constexpr const char* kZeroDigits = "00000000";
// What to do with a file that another program saved again with our metadata.
constexpr const char* kStaleChecksums =
    "its checksums then describe the old file: leave lockstep.checksum and "
    "lockstep.tensor_crc32 out of the metadata when saving it again";
// Below this much data a thread costs more than the CRC it would take off.
constexpr uint64_t kCrcThreadFrom = uint64_t{1} << 20;

std::string hex8(uint32_t v) { return fmt::format("{:08x}", v); }

// libdeflate's CRC-32 is zlib's CRC at several times the speed, where it is
// built in; zlib combines CRCs of adjacent ranges (crc32_combine) either way.
uint32_t crc(uint32_t c, const void* p, size_t n) {
#if LOCKSTEP_HAVE_DEFLATE
  return libdeflate_crc32(c, p, n);
#else
  return static_cast<uint32_t>(crc32_z(c, static_cast<const Bytef*>(p), n));
#endif
}
// z_off_t is 64-bit on the LP64 systems lockstep builds for.
uint32_t crc_combine(uint32_t a, uint32_t b, uint64_t len_b) {
  return static_cast<uint32_t>(crc32_combine(a, b, static_cast<z_off_t>(len_b)));
}

// Streams data to a file in large writes (see kChunk, kGatherBelow).
class StreamWriter {
 public:
  StreamWriter(int fd, const std::string& file, uint64_t offset, uint64_t total,
               const std::function<void(uint64_t, uint64_t)>& on_progress)
      : fd_(fd),
        file_(file),
        offset_(offset),
        total_(total),
        kicked_(offset),
        on_progress_(on_progress) {}

  // Appends n bytes at p (which may be null when n is 0: an empty tensor's
  // data, which memcpy must not be given even for 0 bytes).
  void append(const char* p, size_t n) {
    if (n == 0) return;
    if (n < kGatherBelow) {
      if (fill_ + n > kChunk) flush();
      if (!buffer_) buffer_.reset(new char[kChunk]);
      std::memcpy(buffer_.get() + fill_, p, n);
      fill_ += n;
      return;
    }
    flush();
    for (size_t done = 0; done < n; done += kChunk) put(p + done, std::min(kChunk, n - done));
  }

  void flush() {
    if (fill_ == 0) return;
    put(buffer_.get(), fill_);
    fill_ = 0;
  }

 private:
  void put(const char* p, size_t n) {
    write_all(fd_, p, n, file_);
    offset_ += n;
#ifdef SYNC_FILE_RANGE_WRITE
    if (offset_ - kicked_ >= kWritebackEvery) {
      // Only a hint: an error here shows up again at fsync, where it counts.
      (void)::sync_file_range(fd_, static_cast<off_t>(kicked_),
                              static_cast<off_t>(offset_ - kicked_), SYNC_FILE_RANGE_WRITE);
      kicked_ = offset_;
    }
#endif
    if (on_progress_) on_progress_(offset_, total_);
  }

  int fd_;
  const std::string& file_;
  uint64_t offset_;
  uint64_t total_;
  uint64_t kicked_;  // writeback requested up to here
  const std::function<void(uint64_t, uint64_t)>& on_progress_;
  std::unique_ptr<char[]> buffer_;
  size_t fill_ = 0;
};

// Where the 8 hex digits of "lockstep.checksum": "crc32:xxxxxxxx" start in the
// JSON header. Matching the quoted key followed by ':' finds only the real key:
// a quote inside a JSON string is escaped, and a closing quote is never
// followed by a letter.
std::optional<size_t> checksum_digits_at(std::string_view json) {
  const std::string key = fmt::format("\"{}\"", kChecksumKey);
  for (size_t at = json.find(key); at != std::string_view::npos; at = json.find(key, at + 1)) {
    size_t i = at + key.size();
    while (i < json.size() && json[i] == ' ') ++i;
    if (i >= json.size() || json[i] != ':') continue;
    ++i;
    while (i < json.size() && json[i] == ' ') ++i;
    if (json.substr(i, 7) == "\"crc32:") return i + 7;
  }
  return std::nullopt;
}

std::optional<uint32_t> parse_hex8(std::string_view s) {
  if (s.size() != 8) return std::nullopt;
  uint32_t v = 0;
  for (char ch : s) {
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | static_cast<uint32_t>(d);
  }
  return v;
}

struct RawHeader {
  std::string bytes;  // length prefix and JSON
  SafetensorsHeader header;
};

// `whole`: also check that the file holds exactly the data the header describes.
RawHeader read_raw_header(int fd, uint64_t size, const std::string& path, bool whole) {
  LOCKSTEP_CHECK(size >= 8,
                 "{}: the file is {} bytes, shorter than the 8-byte safetensors length prefix: "
                 "empty or truncated; use an older checkpoint",
                 path, size);
  RawHeader r;
  r.bytes.resize(8);
  pread_all(fd, r.bytes.data(), 8, 0, path);
  uint64_t n = 0;
  std::memcpy(&n, r.bytes.data(), 8);
  LOCKSTEP_CHECK(n <= kMaxSafetensorsHeaderBytes,
                 "{}: the header length field says {} bytes, more than safetensors allows ({}); "
                 "this is not a safetensors file, or its first bytes are corrupt",
                 path, n, kMaxSafetensorsHeaderBytes);
  LOCKSTEP_CHECK(n <= size - 8,
                 "{}: truncated: the header length field says {} bytes, but only {} follow it; "
                 "the write was cut off or the file is not a safetensors file",
                 path, n, size - 8);
  r.bytes.resize(8 + n);
  pread_all(fd, r.bytes.data() + 8, n, 8, path);
  r.header = decode_safetensors_header(std::string_view(r.bytes).substr(8), path);
  if (whole) check_data_size(r.header, size, path);
  return r;
}

// The per-tensor CRCs of the metadata, one per tensor.
std::vector<uint32_t> tensor_checksums(const SafetensorsHeader& h, const std::string& path) {
  const std::string& list = h.metadata.at(kTensorChecksumsKey);
  std::vector<uint32_t> out;
  for (size_t at = 0; at < list.size(); at += 9) {
    auto v = parse_hex8(std::string_view(list).substr(at, 8));
    LOCKSTEP_CHECK(v && (at + 8 == list.size() || list[at + 8] == ','),
                   "{}: metadata {} is malformed at character {}; the header is corrupt", path,
                   kTensorChecksumsKey, at);
    out.push_back(*v);
  }
  // A whole list of another length is what a program writes that saves other
  // tensors (save_model keeps one name of a tied weight) with our metadata.
  LOCKSTEP_CHECK(out.size() == h.tensors.size(),
                 "{}: metadata {} lists {} checksums for {} tensors: the file was saved again by "
                 "another program, with other tensors and this metadata copied ({}), or the "
                 "header is corrupt",
                 path, kTensorChecksumsKey, out.size(), h.tensors.size(), kStaleChecksums);
  return out;
}

}  // namespace

uint64_t write_safetensors(int fd, const std::string& file, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& metadata,
                           const SafetensorsWriteOptions& options) {
  std::vector<Tensor> sources;
  std::vector<TensorEntry> entries;
  for (const auto& [name, t] : tensors) {
    LOCKSTEP_CHECK(t.defined(), "write {}: tensor '{}' is undefined", file, name);
    Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
    sources.push_back(c.contiguous());
    entries.push_back({.name = name, .dtype = t.dtype(), .shape = t.shape()});
  }
  for (const char* key : {kChecksumKey, kTensorChecksumsKey})
    LOCKSTEP_CHECK(!metadata.count(key),
                   "write {}: metadata key '{}' is reserved for the checksum the writer computes; "
                   "remove it (load_checkpoint drops it after verifying)",
                   file, key);

  // The header's size does not depend on the CRC values: write it with zeros
  // now and again with the real values at the end.
  std::map<std::string, std::string> meta = metadata;
  std::string crcs;
  for (size_t i = 0; i < entries.size(); ++i)
    crcs += fmt::format("{}{}", i ? "," : "", kZeroDigits);
  meta[kTensorChecksumsKey] = crcs;
  meta[kChecksumKey] = fmt::format("crc32:{}", kZeroDigits);
  const std::string placeholder = encode_safetensors_header(entries, meta);
  uint64_t data_bytes = 0;
  for (const auto& s : sources) data_bytes += s.numel() * s.element_size();
  const uint64_t total = placeholder.size() + data_bytes;

  // The CRCs are computed on another thread while this one writes, so they
  // cost little more than the time the writes take anyway.
  // (The future waits for that thread even when a write throws.)
  auto tensor_crcs = std::async(data_bytes >= kCrcThreadFrom ? std::launch::async : std::launch::deferred,
                                [&sources] {
                                  std::vector<uint32_t> out;
                                  for (const auto& t : sources)
                                    out.push_back(crc(0, t.raw_data(), t.numel() * t.element_size()));
                                  return out;
                                });
  write_all(fd, placeholder.data(), placeholder.size(), file);
  StreamWriter out(fd, file, placeholder.size(), total, options.on_progress);
  for (const auto& t : sources)
    out.append(static_cast<const char*>(t.raw_data()), t.numel() * t.element_size());
  out.flush();
  uint32_t data_crc = 0;
  crcs.clear();
  const std::vector<uint32_t> c = tensor_crcs.get();
  for (size_t i = 0; i < sources.size(); ++i) {
    data_crc = crc_combine(data_crc, c[i], sources[i].numel() * sources[i].element_size());
    crcs += fmt::format("{}{:08x}", i ? "," : "", c[i]);
  }

  meta[kTensorChecksumsKey] = crcs;
  const std::string zeroed = encode_safetensors_header(entries, meta);
  const uint32_t file_crc = crc_combine(crc(0, zeroed.data(), zeroed.size()), data_crc, data_bytes);
  meta[kChecksumKey] = "crc32:" + hex8(file_crc);
  const std::string header = encode_safetensors_header(entries, meta);
  LOCKSTEP_ASSERT(header.size() == placeholder.size());
  pwrite_all(fd, header.data(), header.size(), 0, file);
  return total;
}

uint64_t write_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& metadata,
                           const SafetensorsWriteOptions& options) {
  uint64_t bytes = 0;
  write_file_atomically(path, [&](int fd, const std::string& temp) {
    bytes = write_safetensors(fd, temp, tensors, metadata, options);
  });
  return bytes;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  UniqueFd fd = open_for_read(path);
  return read_raw_header(fd.get(), file_size(fd.get(), path), path, /*whole=*/false).header;
}

SafetensorsFile read_safetensors(const std::string& path, const SafetensorsReadOptions& options) {
  UniqueFd fd = open_for_read(path);
  const uint64_t size = file_size(fd.get(), path);
  RawHeader raw = read_raw_header(fd.get(), size, path, /*whole=*/true);
  const SafetensorsHeader& h = raw.header;

  // The whole-file CRC runs over the header with its own digits as zeros.
  std::optional<uint32_t> stored_crc;
  if (h.metadata.count(kChecksumKey)) {
    auto at = checksum_digits_at(std::string_view(raw.bytes).substr(8));
    stored_crc = at ? parse_hex8(std::string_view(raw.bytes).substr(8 + *at, 8)) : std::nullopt;
    LOCKSTEP_CHECK(stored_crc && h.metadata.at(kChecksumKey) == "crc32:" + hex8(*stored_crc),
                   "{}: metadata {} is \"{}\", expected \"crc32:\" and 8 lowercase hex digits; the "
                   "header is corrupt",
                   path, kChecksumKey, h.metadata.at(kChecksumKey));
    std::memcpy(raw.bytes.data() + 8 + *at, kZeroDigits, 8);
  } else {
    LOCKSTEP_CHECK(!options.require_checksum,
                   "{}: no '{}' in the header metadata: not a lockstep checkpoint (a plain "
                   "safetensors file?); read it with require_checksum = false to load it "
                   "without verification",
                   path, kChecksumKey);
  }
  std::vector<uint32_t> stored_tensor_crcs;
  if (h.metadata.count(kTensorChecksumsKey)) stored_tensor_crcs = tensor_checksums(h, path);
  uint32_t file_crc = crc(0, raw.bytes.data(), raw.bytes.size());

#ifdef POSIX_FADV_SEQUENTIAL
  (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  SafetensorsFile out;
  out.metadata = h.metadata;
  // A tensor whose sum is another tensor's may be that tensor moved (the file
  // saved again in another order) or damage that happens to equal it (a
  // LayerNorm weight zeroed on disk next to its zero bias): only when every
  // sum is there, each once, were the tensors moved. Until then the error waits.
  std::vector<uint32_t> computed;
  std::optional<size_t> first_failed;
  const auto corrupt = [&](size_t i) {
    const TensorEntry& e = h.tensors[i];
    return Error(fmt::format(
        "{}: tensor '{}' (file bytes {} to {}) fails its checksum: stored crc32 {}, computed {}; "
        "the data is corrupt, use an older checkpoint",
        path, e.name, h.data_offset() + e.begin, h.data_offset() + e.end,
        hex8(stored_tensor_crcs[i]), hex8(computed[i])));
  };
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const TensorEntry& e = h.tensors[i];
    Tensor t = Tensor::empty(e.shape, e.dtype);
    char* p = static_cast<char*>(t.raw_data());
    uint32_t c = 0;
    for (uint64_t done = 0; done < e.nbytes(); done += kChunk) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kChunk, e.nbytes() - done));
      pread_all(fd.get(), p + done, len, h.data_offset() + e.begin + done, path);
      c = crc(c, p + done, len);
    }
    file_crc = crc_combine(file_crc, c, e.nbytes());
    computed.push_back(c);
    const bool failed = !stored_tensor_crcs.empty() && c != stored_tensor_crcs[i];
    if (failed && !first_failed) first_failed = i;
    // A sum no tensor should have: damaged, whatever the others hold.
    if (failed && std::find(stored_tensor_crcs.begin(), stored_tensor_crcs.end(), c) ==
                      stored_tensor_crcs.end())
      throw corrupt(*first_failed);
    if (e.dtype == DType::boolean && !failed) {
      const auto* b = reinterpret_cast<const uint8_t*>(p);
      LOCKSTEP_CHECK(std::all_of(b, b + e.nbytes(), [](uint8_t v) { return v <= 1; }),
                     "{}: bool tensor '{}' holds bytes other than 0 and 1; the data is corrupt",
                     path, e.name);
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  if (first_failed) {
    std::vector<uint32_t> found = computed, stored = stored_tensor_crcs;
    std::sort(found.begin(), found.end());
    std::sort(stored.begin(), stored.end());
    if (found != stored) throw corrupt(*first_failed);
    throw Error(fmt::format(
        "{}: tensor '{}' has the checksum that metadata {} lists for another tensor: the "
        "tensors are in another order than when lockstep wrote them, as when another program "
        "saves the file again with this metadata copied ({})",
        path, h.tensors[*first_failed].name, kTensorChecksumsKey, kStaleChecksums));
  }
  if (stored_crc && file_crc != *stored_crc) {
    const std::string mismatch = fmt::format("{}: checksum mismatch: stored crc32 {}, computed {}",
                                             path, hex8(*stored_crc), hex8(file_crc));
    if (stored_tensor_crcs.empty())
      throw Error(mismatch + "; the file is corrupt, use an older checkpoint");
    throw Error(fmt::format(
        "{}; every tensor's data matches its own checksum, so the header was altered: damaged "
        "(use an older checkpoint), or written again by another program with this metadata "
        "copied ({})",
        mismatch, kStaleChecksums));
  }
  return out;
}

}  // namespace lockstep::runtime
