#include "lockstep/optim/broadcast_text.h"

#include <cstdint>
#include <vector>

namespace lockstep::optim {

std::string broadcast_text(const std::string& text, collectives::ProcessGroup* group) {
  if (group == nullptr || group->size() == 1) return text;
  runtime::Tensor size = runtime::Tensor::from_vector<int64_t>({static_cast<int64_t>(text.size())}, {1});
  group->broadcast(size, {.root = 0})->wait();
  const int64_t n = size.to_vector<int64_t>()[0];
  if (n == 0) return {};
  // One i32 per byte: collectives take no u8 (and a message is short).
  std::vector<int32_t> bytes(static_cast<size_t>(n), 0);
  if (group->rank() == 0)
    for (size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  runtime::Tensor data = runtime::Tensor::from_vector<int32_t>(bytes, {n});
  group->broadcast(data, {.root = 0})->wait();
  std::string out;
  for (int32_t b : data.to_vector<int32_t>()) out.push_back(static_cast<char>(b));
  return out;
}

}  // namespace lockstep::optim
