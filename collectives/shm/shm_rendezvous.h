// How the ranks of a shm group meet through the store to share the names of
// the segments they map: the group's own segment, and the segments of its
// shared tensor pools. Every name is unlinked once every rank has mapped it,
// so nothing is left in /dev/shm even if ranks are killed later.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "lockstep/collectives/shm/shm_comm.h"
#include "lockstep/collectives/shm/shm_pool.h"
#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives::shm {

// "<group>/shm/<instance>/": the store keys of this group, apart from those of
// an earlier group made under the same name.
std::string rendezvous_prefix(distributed::Store& store, const std::string& name, int rank);

// Rank 0 creates the segment and publishes "segment" = "<name> <buffer bytes>
// <host>" (or "error <message>"); each rank maps it and sets
// "attached/<rank>" ("ok" or "error <message>"); rank 0 unlinks the name once
// all have and sets "ready". Throws, naming the rank, when one cannot join
// (on another host, say).
std::unique_ptr<Comm> join_group(distributed::Store& store, const std::string& prefix,
                                 const std::string& name, int rank, int size,
                                 std::chrono::milliseconds timeout, size_t buffer_bytes,
                                 std::chrono::microseconds spin);

// The group's pool number `index` (pools are numbered in reservation order),
// `bytes` per rank, under "pool/<index>/": each rank creates a segment and
// publishes its name ("made/<rank>"), maps every other rank's and says so
// ("mapped/<rank>"). nullptr on every rank, with a warning from rank 0, when
// any rank could not create or map one (a full /dev/shm).
std::shared_ptr<Pool> join_pool(distributed::Store& store, const std::string& prefix, int index,
                                int rank, int size, size_t bytes,
                                std::chrono::milliseconds timeout);

}  // namespace lockstep::collectives::shm
