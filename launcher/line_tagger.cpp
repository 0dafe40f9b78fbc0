#include "launcher/line_tagger.h"

namespace lockstep::launcher {

std::string LineTagger::feed(std::string_view data) {
  std::string out;
  // The '\n' of a "\r\n" split across two reads belongs to the line already out.
  if (after_cr_ && !data.empty() && data.front() == '\n') {
    out += '\n';
    data.remove_prefix(1);
  }
  after_cr_ = false;
  size_t start = 0;
  for (size_t at = data.find_first_of("\r\n"); at != std::string_view::npos;
       at = data.find_first_of("\r\n", start)) {
    size_t end = at + 1;
    if (data[at] == '\r' && end < data.size() && data[end] == '\n') ++end;
    out += prefix_;
    out += pending_;
    out.append(data.substr(start, end - start));
    pending_.clear();
    start = end;
    after_cr_ = data[end - 1] == '\r' && end == data.size();
  }
  pending_.append(data.substr(start));
  if (pending_.size() >= kMaxPending) {
    out += prefix_;
    out += pending_;
    out += '\n';
    pending_.clear();
  }
  return out;
}

std::string LineTagger::finish() {
  if (pending_.empty()) return {};
  std::string out = prefix_ + pending_ + "\n";
  pending_.clear();
  return out;
}

}  // namespace lockstep::launcher
