// The forum's questions about DataParallel and DDP that need both sides in
// one place (docs/data-parallel-questions.md links each answer to its test):
// whose BatchNorm statistics win, and saving on rank 0 then loading on every
// rank onto its own device.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/collectives/spawn.h"
#include "lockstep/nn/data_parallel.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/checkpoint/checkpoint.h"
#include "lockstep/distributed/device_select.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"

namespace fs = std::filesystem;
namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
namespace lr = lockstep::runtime;
using lockstep::runtime::Device;
using lockstep::runtime::Tensor;

namespace {

// The forum's batch: BatchNorm2d(3, momentum=1.0) sees 8 images of mean 7 and
// standard deviation 12, then 8 of mean -9 and standard deviation 5.
struct ForumBatch {
  Tensor first, second, whole;
};

ForumBatch forum_batch() {
  lr::Generator g(11);
  ForumBatch b;
  b.first = lr::randn({8, 3, 4, 4}, lr::DType::f32, g) * 12.0 + 7.0;
  b.second = lr::randn({8, 3, 4, 4}, lr::DType::f32, g) * 5.0 - 9.0;
  b.whole = lr::cat({b.first, b.second}, 0);
  return b;
}

std::shared_ptr<nn::Sequential> forum_model() {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::BatchNorm2d>(3, nn::BatchNormOptions{.momentum = 1.0}));
  return m;
}

// The running mean BatchNorm alone keeps after one training forward on x.
Tensor running_mean_after(const Tensor& x) {
  nn::BatchNorm2d alone(3, {.momentum = 1.0});
  alone.forward(x);
  return alone.running_mean;
}

}  // namespace

TEST_CASE("the forum's BatchNorm example: DataParallel keeps the first half's running mean, "
          "DDP rank 0's, SyncBatchNorm the whole batch's",
          "[data_parallel][ddp][sync_bn]") {
  const ForumBatch b = forum_batch();
  const Tensor first_half = running_mean_after(b.first);
  const Tensor whole = running_mean_after(b.whole);
  for (double m : lt::values(first_half)) CHECK(m == Approx(7.0).margin(3.0));
  for (double m : lt::values(whole)) CHECK(m == Approx(-1.0).margin(2.0));

  SECTION("DataParallel on two devices: the first chunk's") {
    auto model = forum_model();
    nn::DataParallel dp(model, {Device::cpu(), Device::cpu()});
    dp.forward(b.whole);
    CHECK(lt::bitwise_equal(model->at<nn::BatchNorm2d>(0)->running_mean, first_half));
  }
  SECTION("DDP without SyncBatchNorm: rank 0's, broadcast before the next forward") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto model = forum_model();
      nn::DistributedDataParallel ddp(model, group);
      ddp.forward(r == 0 ? b.first : b.second);
      // Each rank normalised its own half and keeps its own running mean...
      const Tensor mine = model->at<nn::BatchNorm2d>(0)->running_mean.clone();
      if (!lt::bitwise_equal(mine, running_mean_after(r == 0 ? b.first : b.second)))
        return "not this rank's half's mean after its forward";
      // ...until rank 0's is copied to all (before each training forward, or
      // as here by hand): the value a rank-0 checkpoint holds.
      ddp.broadcast_parameters();
      return lt::bitwise_equal(model->at<nn::BatchNorm2d>(0)->running_mean, first_half)
                 ? ""
                 : "not rank 0's after the broadcast";
    });
    for (const auto& p : problems) CHECK(p == "");
  }
  SECTION("DDP with SyncBatchNorm: the whole batch's, on every rank") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto model = nn::convert_sync_batchnorm(forum_model(), group);
      nn::DistributedDataParallel ddp(model, group);
      ddp.forward(r == 0 ? b.first : b.second);
      auto* bn = dynamic_cast<nn::SyncBatchNorm*>(
          std::dynamic_pointer_cast<nn::Sequential>(model)->operator[](0).get());
      if (bn == nullptr) return "not converted";
      return lt::mismatch("running_mean", bn->running_mean, whole, 1e-5);
    });
    for (const auto& p : problems) CHECK(p == "");
  }
}

TEST_CASE("save on rank 0, load on every rank onto its own device: the same parameters "
          "everywhere",
          "[ddp][checkpoint][spawn]") {
  const fs::path dir = fs::temp_directory_path() / fmt::format("lockstep-rank0-save-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto batch = lt::global_batch(8, 1);
  lockstep::collectives::spawn(2, [&](int rank) {
    const Device device = lockstep::distributed::select_device({.request = "cpu"});
    auto group = lockstep::collectives::init_process_group();
    auto model = lt::small_mlp(3);
    model->to(device);
    nn::DistributedDataParallel ddp(model, group);
    lockstep::optim::SGD sgd(model->parameters(), {.lr = 0.1});
    lt::loss_of(ddp, lt::shard(batch, rank, 2)).backward();
    sgd.step();
    const fs::path file = dir / "model.safetensors";
    if (rank == 0) lr::save_checkpoint(file, {.tensors = model->state_dict().items()});
    group->barrier()->wait();  // the file is complete before anyone reads it
    auto fresh = lt::small_mlp(100 + rank);  // other weights until loaded
    const lr::CheckpointContent back = lr::load_checkpoint(file, {.device = device});
    fresh->load_state_dict(nn::StateDict(back.tensors));
    std::string text;
    for (const Tensor& p : fresh->parameters())
      for (double v : p.to(Device::cpu()).to_vector<double>()) text += fmt::format("{:.9g} ", v);
    std::ofstream(dir / fmt::format("rank{}", rank)) << text;
    bool same = true;
    for (size_t i = 0; i < model->parameters().size(); ++i)
      same = same && lt::bitwise_equal(fresh->parameters()[i], model->parameters()[i]);
    if (!same) throw lockstep::Error("loaded parameters differ from the trained ones");
  });
  const auto read = [&](int r) {
    std::ifstream in(dir / fmt::format("rank{}", r));
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  CHECK_FALSE(read(0).empty());
  CHECK(read(0) == read(1));
  fs::remove_all(dir);
}
