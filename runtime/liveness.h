// Heartbeats that let lockstep-run tell a hung rank from a busy one.
//
// Under lockstep-run (LOCKSTEP_HEARTBEAT_FD set), start_heartbeats() starts
// one thread that every LOCKSTEP_HEARTBEAT_MS (1000) sends the launcher one
// byte: 'P' when the process made progress since the last beat, 'I' when
// not. Progress is CPU time used (at least 1% of the interval: computing,
// evaluating, serialising a checkpoint, spinning on a GPU) or time spent
// inside a BusyScope: waiting for other ranks in a collective or the store,
// writing or reading a checkpoint file, reading a dataset's IDX file. The launcher (--hang-timeout, 10 s) calls a rank
// hung when no beat comes (stopped by SIGSTOP, frozen) or only 'I' comes (a
// deadlock: blocked, using no CPU, not waiting for peers), and stops the job.
// A rank that sleeps on purpose for longer marks it with a BusyScope. A rank
// blocked writing to a slow reader beats 'I' too: the beats cannot tell it
// from a deadlock, so the launcher does, by not calling ranks hung while its
// own output (the ranks', or its queue for them) takes no more data. At
// exit (return from main, exit()) the thread's last message is 'L', leaving:
// the launcher stops expecting beats from the rank, whose process may go on
// without this program (a wrapper script's later steps), until a beat comes
// again (a later lockstep program of the same rank).
// These bytes are part of the wire protocol: change
// distributed/wire_protocol.h's kWireProtocol with them.
#pragma once

namespace lockstep::runtime {

// While alive, this process counts as making progress however little CPU it
// uses. Cheap (one atomic add each way); nests; any thread.
class BusyScope {
 public:
  BusyScope();
  ~BusyScope();
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;
};

// Starts the heartbeat thread once, when LOCKSTEP_HEARTBEAT_FD names one;
// else does nothing. init_process_group() calls it. Throws naming the
// variable when LOCKSTEP_HEARTBEAT_FD or LOCKSTEP_HEARTBEAT_MS is malformed.
void start_heartbeats();

}  // namespace lockstep::runtime
