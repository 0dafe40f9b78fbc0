#include "lockstep/train/data_digest.h"

#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/rank_text.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/stable_hash.h"

namespace lockstep::train {

namespace {

// Each piece hashed with the digest so far as its seed: a part's name and
// length go in too, so no shift of bytes between parts or splits digests
// the same.
uint64_t chain(uint64_t h, std::string_view bytes) {
  return runtime::hash_bytes(bytes.data(), bytes.size(), h);
}

}  // namespace

DataDigest& DataDigest::add(std::string_view part, const runtime::Tensor& t) {
  const runtime::Tensor c = t.to(runtime::Device::cpu()).contiguous();
  std::string head = fmt::format("{}:{}[", part, runtime::dtype_name(c.dtype()));
  for (const int64_t n : c.shape()) head += fmt::format("{},", n);
  h_ = chain(h_, head + "]");
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  h_ = chain(h_, std::string_view(static_cast<const char*>(c.raw_data()), n));
  return *this;
}

DataDigest& DataDigest::add(std::string_view part, std::string_view bytes) {
  h_ = chain(h_, fmt::format("{}:bytes[{}]", part, bytes.size()));
  h_ = chain(h_, bytes);
  return *this;
}

std::string DataDigest::hex() const { return fmt::format("{:016x}", h_); }

std::string same_on_every_rank(const DataDigest& d, const std::string& path,
                               collectives::ProcessGroup& group) {
  const std::string mine = d.hex();
  const std::vector<std::string> all = collectives::allgather_text(mine, group);
  std::string listed;
  bool same = true;
  for (size_t r = 0; r < all.size(); ++r) {
    listed += fmt::format("{}rank {}: {}", r == 0 ? "" : ", ", r, all[r]);
    same = same && all[r] == all[0];
  }
  LOCKSTEP_CHECK(same,
                 "rank {}: the ranks loaded different data from {} (digests {}); every rank must "
                 "train on the same files: give each node the same version of them, or put them "
                 "on a file system every rank shares",
                 group.rank(), path, listed);
  return mine;
}

}  // namespace lockstep::train
