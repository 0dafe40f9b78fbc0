#include "lockstep/collectives/rank_text.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "lockstep/runtime/tensor.h"

namespace lockstep::collectives {
namespace {

using runtime::DType;
using runtime::Tensor;

int64_t words_for(int64_t bytes) { return std::max<int64_t>(1, (bytes + 7) / 8); }

// `text` in the first bytes of `words` i64 zeros.
Tensor to_words(const std::string& text, int64_t words) {
  Tensor t = Tensor::zeros({words}, DType::i64);
  if (!text.empty()) std::memcpy(t.raw_data(), text.data(), text.size());
  return t;
}

}  // namespace

std::string broadcast_text(const std::string& text, ProcessGroup& group, int root) {
  if (group.size() == 1) return text;
  Tensor length = Tensor::from_vector<int64_t>({static_cast<int64_t>(text.size())}, {1});
  group.broadcast(length, {.root = root})->wait();
  const int64_t bytes = length.to_vector<int64_t>()[0];
  if (bytes == 0) return {};
  Tensor words = to_words(group.rank() == root ? text : std::string(), words_for(bytes));
  group.broadcast(words, {.root = root})->wait();
  return std::string(static_cast<const char*>(words.raw_data()), static_cast<size_t>(bytes));
}

std::vector<std::string> allgather_text(const std::string& mine, ProcessGroup& group) {
  const int n = group.size();
  Tensor length = Tensor::from_vector<int64_t>({static_cast<int64_t>(mine.size())}, {1});
  Tensor lengths = Tensor::zeros({n}, DType::i64);
  group.allgather(lengths, length)->wait();
  const auto bytes = lengths.to_vector<int64_t>();
  const int64_t words = words_for(*std::max_element(bytes.begin(), bytes.end()));
  Tensor all = Tensor::zeros({words * n}, DType::i64);
  group.allgather(all, to_words(mine, words))->wait();
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(n));
  const auto* base = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < n; ++r)
    out.emplace_back(base + r * words * 8, static_cast<size_t>(bytes[static_cast<size_t>(r)]));
  return out;
}

}  // namespace lockstep::collectives
