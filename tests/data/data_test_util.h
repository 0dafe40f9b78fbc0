// Helpers for the data tests: IDX and gzip encoders (and TempDir).
#pragma once

#include <zlib.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/temp_dir.h"

namespace lockstep::testing {

using Bytes = std::vector<uint8_t>;

inline void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("test: cannot write " + path);
}

// An IDX file: magic 00 00 type ndims, big-endian u32 dims, then `payload`
// (already big-endian; the caller decides whether it matches the dims).
inline Bytes idx_file(uint8_t type, const std::vector<uint32_t>& dims, const Bytes& payload) {
  Bytes b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    b.push_back(static_cast<uint8_t>(d >> 24));
    b.push_back(static_cast<uint8_t>(d >> 16));
    b.push_back(static_cast<uint8_t>(d >> 8));
    b.push_back(static_cast<uint8_t>(d));
  }
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

// `data` compressed as one gzip member.
inline Bytes gzip(const Bytes& data) {
  z_stream zs{};
  // 15 + 16: gzip wrapper.
  if (deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw std::runtime_error("test: deflateInit2 failed");
  Bytes out(deflateBound(&zs, static_cast<uLong>(data.size())) + 64);
  zs.next_in = const_cast<Bytef*>(data.data());
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  int ret = deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  if (ret != Z_STREAM_END) throw std::runtime_error("test: deflate failed");
  return out;
}

}  // namespace lockstep::testing
