// Threads used by the CPU kernels (OpenBLAS). lockstep runs one rank per core
// slot, so programs usually want 1 (ranks, not threads, use the cores).
#pragma once

namespace lockstep::runtime {

void set_num_threads(int n);  // n >= 1
int num_threads();

}  // namespace lockstep::runtime
