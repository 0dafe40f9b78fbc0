#include "lockstep/distributed/wire_protocol.h"

#include <charconv>

#include <fmt/format.h>

#include "lockstep/config.h"
#include "lockstep/runtime/error.h"

namespace lockstep::distributed {

void require_launcher_wire(const runtime::EnvLookup& env) {
  const auto wire = env(kLauncherWireVar);
  if (!wire) return;
  int number = -1;
  const auto [end, ec] = std::from_chars(wire->data(), wire->data() + wire->size(), number);
  if (ec == std::errc() && end == wire->data() + wire->size() && number == kWireProtocol) return;
  throw Error(fmt::format(
      "this program runs lockstep {} wire {}, but the lockstep-run that started it runs "
      "lockstep {} wire {} ({}={}): the two would read the rank's environment and heartbeats "
      "differently. Start the program with the lockstep-run of the build it is linked against "
      "(the same install's bin/lockstep-run), on every node",
      LOCKSTEP_VERSION_STRING, kWireProtocol, env(kLauncherVersionVar).value_or("(unknown)"),
      *wire, kLauncherWireVar, *wire));
}

}  // namespace lockstep::distributed
