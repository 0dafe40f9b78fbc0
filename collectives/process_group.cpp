#include "lockstep/collectives/process_group.h"

#include <fmt/format.h>

namespace lockstep::collectives {

std::shared_ptr<SharedTensorPool> ProcessGroup::reserve_shared_pool(size_t /*bytes*/) {
  return nullptr;  // staging copies are cheap next to this backend's own transfers
}

ProcessGroup::ProcessGroup(int rank, int size, std::string name, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), name_(std::move(name)), timeout_(timeout) {
  LOCKSTEP_CHECK(size >= 1, "process group '{}': size must be >= 1, got {}", name_, size);
  LOCKSTEP_CHECK(rank >= 0 && rank < size,
                 "process group '{}': rank {} is outside [0, {}) for a group of {} ranks", name_,
                 rank, size, size);
  LOCKSTEP_CHECK(timeout.count() > 0, "process group '{}': timeout must be positive, got {} ms",
                 name_, timeout.count());
}

std::string ProcessGroup::describe(std::string_view op, const Tensor* tensor,
                                   std::string_view extra) const {
  std::string text = fmt::format("{} #{}", op, seq_);
  if (tensor != nullptr) {
    text += fmt::format(" ({}, {} elements{}{})", runtime::dtype_name(tensor->dtype()),
                        tensor->numel(), extra.empty() ? "" : ", ", extra);
  } else if (!extra.empty()) {
    text += fmt::format(" ({})", extra);
  }
  return text;
}

std::string ProcessGroup::timeout_message(const std::string& description,
                                          std::chrono::milliseconds t) const {
  return fmt::format(
      "{} timed out after {:.3g} s on rank {} of group '{}' ({}, {} ranks): some rank did not "
      "join this collective in time (it may have died, be stuck, or be issuing a different "
      "collective; LOCKSTEP_DEBUG=detail names divergent calls); raise the timeout with "
      "LOCKSTEP_TIMEOUT_S or the call's .timeout if the wait was legitimate",
      description, static_cast<double>(t.count()) / 1000.0, rank_, name_, backend(), size_);
}

void ProcessGroup::check_tensor(std::string_view op, const Tensor& tensor) const {
  using runtime::DType;
  LOCKSTEP_CHECK(tensor.defined(), "{} on group '{}': the tensor is undefined", op, name_);
  const DType d = tensor.dtype();
  LOCKSTEP_CHECK(d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16 ||
                     d == DType::i32 || d == DType::i64,
                 "{} on group '{}': dtype {} is not supported by collectives; use f32, f64, bf16, "
                 "f16, i32 or i64 (convert with .to(DType))",
                 op, name_, runtime::dtype_name(d));
  LOCKSTEP_CHECK(tensor.is_contiguous(),
                 "{} on group '{}': the tensor must be contiguous; call .contiguous() and copy "
                 "the result back after the collective",
                 op, name_);
}

void ProcessGroup::check_root(std::string_view op, int root) const {
  LOCKSTEP_CHECK(root >= 0 && root < size_,
                 "{} on group '{}': root {} is not a rank of this group of {} ranks", op, name_,
                 root, size_);
}

}  // namespace lockstep::collectives
