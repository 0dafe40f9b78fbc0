#include "lockstep/distributed/store/store.h"

namespace lockstep::distributed {

Bytes to_bytes(std::string_view text) { return Bytes(text.begin(), text.end()); }

std::string to_string(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace lockstep::distributed
