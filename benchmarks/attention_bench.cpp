// Times self-attention forward + backward over a fused projection's packed
// qkv [B, T, 3C], both ways lockstep can compute it: attention_from_qkv (the
// blocked kernel on the packed layout, one gradient) and
// attention_from_qkv_composed (three head views, scaled_dot_product_attention,
// the heads merged back; what the GPT's attention did before). Alternated
// call by call in one process, so drift hits both alike; medians.
//
//   build/bin/attention_bench                       (gpt_train's shape: 8 x 128, width 128, 4 heads)
//   build/bin/attention_bench --seq-len 256 --n-embd 256 --heads 8 --json out.json
#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <iostream>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli_checks.h"
#include "common/writable_file.h"
#include "harness.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/threads.h"

using namespace lockstep;
using runtime::DType;
using runtime::Tensor;

int main(int argc, char** argv) {
  int64_t batch = 8, seq_len = 128, n_embd = 128, heads = 4;
  int iters = 200, warmup = 10, threads = 1;
  bool causal = true;
  std::string json_file;
  CLI::App app{"Self-attention over a packed qkv, forward and backward: the blocked kernel on "
               "the packed layout against split heads and merge."};
  app.add_option("--batch", batch, "sequences")->check(cli_checks::positive);
  app.add_option("--seq-len", seq_len, "tokens per sequence")->check(cli_checks::positive);
  app.add_option("--n-embd", n_embd, "width C (qkv is [B, T, 3C])")->check(cli_checks::positive);
  app.add_option("--heads", heads, "attention heads (dividing --n-embd)")
      ->check(cli_checks::positive);
  app.add_option("--iters", iters, "timed calls of each")->check(cli_checks::positive);
  app.add_option("--warmup", warmup, "untimed calls of each first")
      ->check(cli_checks::non_negative);
  app.add_option("--threads", threads, "BLAS threads")->check(cli_checks::positive);
  app.add_option("--causal", causal, "causal attention (as the GPT's)");
  app.add_option("--json", json_file, "write the results as JSON to this file")
      ->check(bench::writable_file);
  CLI11_PARSE(app, argc, argv);
  if (n_embd % heads != 0) {
    fmt::print(stderr, "attention_bench: --n-embd {} must be a multiple of --heads {}\n", n_embd,
               heads);
    return 2;
  }
  runtime::set_num_threads(threads);
  runtime::Generator g(1);
  const Tensor values = runtime::randn({batch, seq_len, 3 * n_embd}, DType::f32, g);
  const Tensor weights = runtime::randn({batch, seq_len, n_embd}, DType::f32, g);
  using Attend = Tensor (*)(const Tensor&, int64_t, const runtime::AttentionOptions&);
  const Attend ways[2] = {runtime::attention_from_qkv, runtime::attention_from_qkv_composed};
  std::vector<double> ms[2];
  for (int i = 0; i < warmup + iters; ++i) {
    for (int w = 0; w < 2; ++w) {
      Tensor qkv = values.detach();
      qkv.requires_grad_(true);
      const auto start = std::chrono::steady_clock::now();
      runtime::sum(ways[w](qkv, heads, {.causal = causal}) * weights).backward();
      const double t =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      if (i >= warmup) ms[w].push_back(t);
    }
  }
  const double packed = bench::median(ms[0]), composed = bench::median(ms[1]);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  fmt::print("# attention_bench: {} x {} tokens, width {}, {} heads{}, {} thread(s), {} calls "
             "each after {}, {}, {}\n",
             batch, seq_len, n_embd, heads, causal ? ", causal" : "", threads, iters, warmup,
             date, bench::machine_description());
  fmt::print("{}", bench::format_table(
                       {"path", "forward + backward median ms", "vs split and merge"},
                       {{"attention_from_qkv", fmt::format("{:.3f}", packed),
                         fmt::format("{:.3f}x", composed / packed)},
                        {"split, sdpa, merge", fmt::format("{:.3f}", composed), "1.000x"}}));
  const nlohmann::json doc = {{"benchmark", "attention_bench"},
                              {"date", date},
                              {"machine", bench::machine_description()},
                              {"batch", batch},
                              {"seq_len", seq_len},
                              {"n_embd", n_embd},
                              {"heads", heads},
                              {"causal", causal},
                              {"threads", threads},
                              {"iters", iters},
                              {"packed_median_ms", packed},
                              {"composed_median_ms", composed},
                              {"speedup", composed / packed}};
  bench::print_json(doc, json_file);
  return 0;
}
