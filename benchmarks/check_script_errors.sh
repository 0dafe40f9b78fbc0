#!/usr/bin/env bash
# ctest's benchmark_script_errors: the comparison scripts, cpu_suite.sh and the PyTorch
# peers, given bad input (a build without the programs, a bad size or list,
# no mpirun, no PyTorch), exit with status 2 (the peers: 1; the C++ benchmarks
# given a bad number: CLI11's 105) and one line naming the problem, without a
# traceback and before running anything. And zero_compare, one of whose world
# sizes fails, still prints the others' rows.
# PyTorch is hidden behind a torch package whose import fails.
#
#   benchmarks/check_script_errors.sh BUILD_DIR SCRATCH_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
work=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=/usr/bin/python3
rm -rf "$work"
mkdir -p "$work/no-torch/torch" "$work/empty-build" "$work/flaky-build/bin"
echo 'raise ImportError("torch hidden by check_script_errors.sh")' \
  >"$work/no-torch/torch/__init__.py"

status=0
# expect STATUS PATTERN COMMAND...: COMMAND exits with STATUS within 60 s,
# its output matches PATTERN and holds no traceback.
expect() {
  local want=$1 pattern=$2
  shift 2
  local out rc
  out=$(cd "$work" && timeout 60 "$@" 2>&1)
  rc=$?
  if [ "$rc" != "$want" ] || ! grep -qE "$pattern" <<<"$out" || grep -q Traceback <<<"$out"; then
    echo "check_script_errors: FAILED: $* (exit $rc, wanted $want and /$pattern/):"
    echo "$out" | tail -n 20
    status=1
  fi
}

hide_torch=(env "PYTHONPATH=$work/no-torch")
for script in allreduce_compare ddp_compare zero_compare; do
  expect 2 "$script: $work/empty-build/bin/.* not found; build it first" \
    $python "$here/$script.py" --build "$work/empty-build"
done
for script in ddp_compare zero_compare; do
  expect 2 "error: argument --sizes: '1,x' is not" $python "$here/$script.py" --sizes 1,x
done
expect 2 "error: argument -b: '4Q' is not a size" \
  $python "$here/allreduce_compare.py" --build "$build" -b 4Q
expect 2 "error: -b 1001: not a whole number of float32 elements" \
  $python "$here/allreduce_compare.py" --build "$build" -b 1001 --no-torch
expect 2 "error: needs .*-f >= 2" $python "$here/allreduce_compare.py" --build "$build" -f 1
for script in allreduce_compare ddp_compare; do
  expect 2 "$script: $work/no-mpirun not found \(give its path with --mpirun\)" \
    $python "$here/$script.py" --build "$build" --mpirun "$work/no-mpirun" --no-torch
  expect 2 "$script: no PyTorch for $python .*--no-torch" \
    "${hide_torch[@]}" $python "$here/$script.py" --build "$build"
done
expect 2 "error: unknown model or backend: foo" \
  $python "$here/ddp_compare.py" --build "$build" --models mlp,foo --no-torch
expect 2 "error: --model foo" $python "$here/zero_compare.py" --build "$build" --model foo
for peer in allreduce_torch step_bench_torch ddp_bench_torch; do
  expect 1 "$peer.py: no PyTorch for $python" "${hide_torch[@]}" $python "$here/$peer.py" --help
done
expect 2 "cpu_suite: --build needs a value" bash "$here/cpu_suite.sh" --build
expect 2 "cpu_suite: unknown argument '--bogus'" bash "$here/cpu_suite.sh" --bogus
# The C++ benchmarks name the rule a bad number breaks (CLI11's own message
# spells out "not in range 0.000000 to" and 309 digits of the largest double).
for bench in zero_bench ddp_bench step_bench checkpoint_bench data_parallel_bench; do
  expect 105 "^--warmup: must be zero or a positive number, not -1" "$build/bin/$bench" --warmup -1
done
expect 105 "^--batch: must be a positive number, not 0" "$build/bin/attention_bench" --batch 0
# A list of models is taken apart at its commas, as by the other benchmarks: the
# error is the bad --rounds, not "--model: mlp,cnn not in {mlp,cnn}".
expect 105 "^--rounds: must be a positive number, not 0" \
  "$build/bin/data_parallel_bench" --model mlp,cnn --rounds 0
expect 105 "^--clients: must be a positive number, not 0" "$build/bin/store_bench" --clients 64,0
# A size past any buffer (inf converted to size_t read as a tiny size).
expect 1 "^allreduce_perf: error: -e 'inf': larger than any buffer" "$build/bin/allreduce_perf" -e inf
# A lockstep-run whose two-rank runs fail; one rank writes one plain row to --json.
cat >"$work/flaky-build/bin/lockstep-run" <<'EOF'
#!/usr/bin/env bash
if [ "$2" = 2 ]; then echo "rank 1 exited with code 1" >&2; exit 1; fi
echo '{"machine": "stand-in", "results": [{"model": "mlp", "mode": "plain", "world_size": 1,
  "backend": "shm", "state_bytes_max": 1048576, "plain_state_bytes": 1048576,
  "max_over_ideal": 1.0, "step_ms": 2.0, "opt_step_ms": 1.0}]}' >"${@: -1}"
EOF
cp "$work/flaky-build/bin/lockstep-run" "$work/flaky-build/bin/zero_bench"
chmod +x "$work/flaky-build/bin/"*
expect 1 "# failed: N=2 \\(errors above\\)" \
  $python "$here/zero_compare.py" --build "$work/flaky-build" --sizes 1,2 --model mlp
expect 1 "^\\| mlp +\\| plain +\\| 1 " \
  $python "$here/zero_compare.py" --build "$work/flaky-build" --sizes 1,2 --model mlp
if ((status == 0)); then
  echo "check_script_errors: every bad input was refused with a clear message"
fi
exit $status
