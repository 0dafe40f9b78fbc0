// The benchmarks' kernel profile (benchmarks/common/kernel_profile.h): names
// shortened and grouped as both sides' traces need, busy time as the union of
// overlapping kernels, and a peer's activities read back from its JSON.
#include <catch2/catch.hpp>

#include "common/kernel_profile.h"

using lockstep::bench::activities_from_json;
using lockstep::bench::category_us_per_step;
using lockstep::bench::compare_profiles;
using lockstep::bench::kernel_category;
using lockstep::bench::ProfiledSide;
using lockstep::bench::short_kernel_name;
using lockstep::bench::summarize_activities;
using lockstep::runtime::DeviceActivity;

TEST_CASE("kernel names are shortened to the kernel itself") {
  CHECK(short_kernel_name("void lockstep::runtime::cuda::(anonymous namespace)::map2_dense<float, "
                          "float, lockstep::Add>(float*, float const*, long)") == "map2_dense");
  CHECK(short_kernel_name("void at::native::vectorized_elementwise_kernel<4, "
                          "at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, "
                          "at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)") ==
        "vectorized_elementwise_kernel");
  // CUTLASS names its kernels by their first template argument.
  CHECK(short_kernel_name("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>"
                          "(cutlass_80_simt_sgemm_128x64_8x5_nn_align1::Params)") ==
        "Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>");
  CHECK(short_kernel_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD");
  CHECK(short_kernel_name("Memset") == "Memset");
  const std::string cudnn(90, 'x');
  CHECK(short_kernel_name(cudnn).size() == 60);
  CHECK(short_kernel_name("plain_kernel") == "plain_kernel");
}

TEST_CASE("kernels are grouped by the work their names say") {
  CHECK(kernel_category("sm90_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nhwckrsc_nhwc") ==
        "conv");
  CHECK(kernel_category("sm90_xmma_dgrad_implicit_gemm_f32f32") == "conv");
  CHECK(kernel_category("Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>") == "gemm");
  CHECK(kernel_category("bn_fw_tr_1C11_kernel_NCHW") == "norm");
  CHECK(kernel_category("channel_partials_planes") == "norm");
  CHECK(kernel_category("cunn_SoftMaxForward") == "softmax/loss");
  CHECK(kernel_category("nll_loss_forward_reduce_cuda_kernel_2d") == "softmax/loss");
  CHECK(kernel_category("max_pool_forward_kernel") == "pool");
  CHECK(kernel_category("multi_tensor_apply_kernel") == "optimizer");
  CHECK(kernel_category("sgd_kernel") == "optimizer");
  CHECK(kernel_category("reduce_kernel") == "reduce");
  CHECK(kernel_category("map1_dense") == "elementwise");
  CHECK(kernel_category("vectorized_elementwise_kernel") == "elementwise");
  CHECK(kernel_category("Memcpy DtoD") == "copy");
  CHECK(kernel_category("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "collective");
  CHECK(kernel_category("nchwToNhwcKernel") == "other");
}

TEST_CASE("a profile sums per kernel and per step, and busy time is the union of intervals") {
  // Two steps; in the second, b overlaps a (another stream).
  const std::vector<DeviceActivity> trace{
      {"void ns::a<int>(int)", 0, 10},   {"void ns::b(float*)", 12, 15},
      {"void ns::a<float>(int)", 20, 30}, {"void ns::b(float*)", 25, 40},
      {"Memset", 50, 51}};
  const auto p = summarize_activities(trace, 2);
  CHECK(p.steps == 2);
  CHECK(p.activities == 5);
  CHECK(p.sum_us == Approx(10 + 3 + 10 + 15 + 1));
  CHECK(p.busy_us == Approx(10 + 3 + 20 + 1));  // [20, 40) once
  REQUIRE(p.kernels.size() == 3);
  CHECK(p.kernels[0].name == "a");  // both instantiations: one kernel
  CHECK(p.kernels[0].calls == 2);
  CHECK(p.kernels[0].total_us == Approx(20));
  CHECK(p.kernels[1].name == "b");
  CHECK(p.kernels[1].total_us == Approx(18));
  CHECK(p.per_step(p.busy_us) == Approx(17));

  const auto j = p.to_json(2);
  CHECK(j["launches_per_step"].get<double>() == Approx(2.5));
  CHECK(j["top_kernels"].size() == 2);
  CHECK(j["top_kernels"][0]["calls_per_step"].get<double>() == Approx(1));

  const auto empty = summarize_activities({}, 3);
  CHECK(empty.busy_us == 0);
  CHECK(empty.kernels.empty());
}

TEST_CASE("a peer's activities are read back from its JSON, and both sides compared") {
  const auto peer_json = nlohmann::json::parse(
      R"json([["void at::native::vectorized_elementwise_kernel<4, F>(int, F)", 100.0, 104.0],
          ["sm90_xmma_fprop_implicit_gemm_f32", 104.0, 150.0],
          ["not an activity"], [1, 2, 3]])json");
  const auto peer_trace = activities_from_json(peer_json);
  REQUIRE(peer_trace.size() == 2);  // malformed entries are skipped
  CHECK(peer_trace[1].end_us == 150.0);
  CHECK(activities_from_json(nlohmann::json::object()).empty());

  const auto peer = summarize_activities(peer_trace, 1);
  const auto ours = summarize_activities(
      {{"sm90_xmma_fprop_implicit_gemm_f32", 0, 40}, {"map1_dense", 40, 41}}, 1);
  const auto categories = category_us_per_step(ours);
  REQUIRE(categories.size() == 2);
  CHECK(categories[0].first == "conv");
  CHECK(categories[0].second == Approx(40));

  const std::string table =
      compare_profiles("resnet", {"lockstep", ours, 0.05}, ProfiledSide{"PyTorch", peer, 0.06});
  CHECK(table.find("| conv us") != std::string::npos);
  CHECK(table.find("PyTorch") != std::string::npos);
  CHECK(table.find("vectorized_elementwise_kernel") != std::string::npos);
  const auto wall_row = table.substr(table.find("| step wall us"));
  CHECK(wall_row.substr(0, wall_row.find('\n')).find("| 50 ") != std::string::npos);
  CHECK(wall_row.substr(0, wall_row.find('\n')).find("| 60 ") != std::string::npos);
  const std::string alone = compare_profiles("resnet", {"DDP", ours, std::nullopt}, std::nullopt);
  CHECK(alone.find("PyTorch") == std::string::npos);
}
