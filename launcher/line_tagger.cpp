#include "launcher/line_tagger.h"

namespace lockstep::launcher {

std::string LineTagger::feed(std::string_view data) {
  std::string out;
  size_t start = 0;
  for (size_t nl = data.find('\n'); nl != std::string_view::npos; nl = data.find('\n', start)) {
    out += prefix_;
    out += pending_;
    out.append(data.substr(start, nl + 1 - start));
    pending_.clear();
    start = nl + 1;
  }
  pending_.append(data.substr(start));
  return out;
}

std::string LineTagger::finish() {
  if (pending_.empty()) return {};
  std::string out = prefix_ + pending_ + "\n";
  pending_.clear();
  return out;
}

}  // namespace lockstep::launcher
