// Writes one large checkpoint into a CheckpointDir, for the test that kills a
// writer mid-write (tests/runtime/checkpoint/test_kill_mid_write.cpp).
//
//   checkpoint_writer <dir> <step> <megabytes> [slow_ms]
//
// Prints "writing" once the first bytes are in the temporary file, then, with
// slow_ms, sleeps that long after every write so that a kill lands mid-write;
// prints "done" when the checkpoint is in place.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>

#include "lockstep/runtime/checkpoint/checkpoint_dir.h"

using namespace lockstep::runtime;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <dir> <step> <megabytes> [slow_ms]\n", argv[0]);
    return 2;
  }
  try {
    const int64_t step = std::stoll(argv[2]);
    const int64_t megabytes = std::stoll(argv[3]);
    const int slow_ms = argc > 4 ? std::stoi(argv[4]) : 0;

    // Parameters of 8 MB, filled with the step so a reader can tell files apart.
    CheckpointContent content;
    const int64_t per_tensor = (8 << 20) / 4;
    for (int64_t i = 0; i * 8 < megabytes; ++i)
      content.tensors.emplace_back("layer" + std::to_string(i) + ".weight",
                                   Tensor::full({per_tensor}, static_cast<double>(step)));
    content.metadata["writer"] = "checkpoint_writer";

    CheckpointDir dir(argv[1], {.keep_last = 5});
    bool announced = false;
    dir.save(content, step, std::nullopt, {.on_progress = [&](uint64_t, uint64_t) {
               if (!announced) {
                 std::printf("writing\n");
                 std::fflush(stdout);
                 announced = true;
               }
               if (slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
             }});
    std::printf("done\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_writer: %s\n", e.what());
    return 1;
  }
}
