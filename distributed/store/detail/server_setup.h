// What TcpStoreServer does before its event loop runs: room for the
// descriptors of the clients it expects, and the socket it listens on.
//
// Internal to distributed/store.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::distributed::store_setup {

// Raises this process's soft open-file limit to hold a connection for each of
// `expected_clients` and the server's own descriptors, as far as the hard
// limit goes; throws naming both limits when that is not far enough. 0 (not
// known) does nothing.
void make_room_for_clients(uint32_t expected_clients);

struct ListeningSocket {
  int fd = -1;  // non-blocking, close-on-exec
  uint16_t port = 0;
};
// Listens on host:port (port 0: any free one) and says which port it got.
// Throws naming the address, what failed and what to do.
ListeningSocket listen_on(const std::string& host, uint16_t port);

}  // namespace lockstep::distributed::store_setup
