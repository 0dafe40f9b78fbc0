// The port lockstep-run leaves free on node 0 for the rank program's own
// rank 0, passed as torchrun's MASTER_PORT. lockstep's ranks find the
// launcher's store through LOCKSTEP_STORE_ADDR and never read it; a program
// written for torchrun (a PyTorch one: init_process_group("gloo")) serves
// its store there from rank 0, as under torchrun --standalone, which also
// leaves MASTER_PORT free for it.
#pragma once

#include <string>

namespace lockstep::launcher {

// A TCP port no socket of this host holds on any address of `store_host`'s
// family: the kernel's choice for a wildcard bind, released at once. As with
// torchrun's free port, another process could take it before rank 0 binds
// it; the program then fails saying the address is in use.
int free_program_port(const std::string& store_host);

// `port` itself (-x MASTER_PORT), checked free the same way; throws
// UsageError naming it when a socket of this host holds it.
int chosen_program_port(const std::string& store_host, int port);

}  // namespace lockstep::launcher
