#!/usr/bin/env bash
# Runs the CPU benchmarks that docs/benchmarks.md and the README quote, one
# after the other in one go, keeps each one's printed table and JSON, and
# draws the plots from that same JSON:
#
#   benchmarks/cpu_suite.sh [--build build] [--out DIR] [--plots docs/plots] [--quick]
#
#   DIR/step_bench.json          one training step against PyTorch (mlp, cnn)
#   DIR/allreduce_compare.{txt,json}  all-reduce against Open MPI, gloo, PyTorch
#   DIR/ddp_compare.{txt,json}   the DDP step against PyTorch's DDP, 1 and 2 ranks
#   DIR/fashion_mnist.{txt,json} the README's main job with --log-json
#   docs/plots/cpu-*.png         scripts/plot-benchmarks DIR
#
# DIR defaults to benchmarks/results/<today>-cpu. --quick runs each benchmark
# briefly (a check that the suite works, not numbers to publish). The PyTorch
# peer is Debian's python3-torch; without it the peer columns say n/a. A
# benchmark that fails is reported at the end and the others still run.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=build
out=benchmarks/results/$(date +%F)-cpu
plots=docs/plots
quick=0
while (($#)); do
  case $1 in
    --build|--out|--plots)
      if (($# < 2)); then echo "cpu_suite: $1 needs a value (see --help)" >&2; exit 2; fi ;;&
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --plots) plots=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cpu_suite: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for program in step_bench allreduce_perf ddp_bench fashion_mnist lockstep-run; do
  if [ ! -x "$build/bin/$program" ]; then
    echo "cpu_suite: $build/bin/$program not found; build first: cmake --build $build" >&2
    exit 2
  fi
done
mkdir -p "$out"
peer=()
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "cpu_suite: no PyTorch for /usr/bin/python3 (apt-get install python3-torch): the peer" \
    "columns say n/a"
  peer=(--no-torch)
fi
export OMP_NUM_THREADS=1 LOCKSTEP_DEVICE=cpu
failed=()

# step NAME COMMAND...: runs COMMAND, its output to DIR/NAME.txt and the terminal.
step() {
  local name=$1
  shift
  echo "cpu_suite: $name: $*"
  local started=$SECONDS
  if ! "$@" 2>&1 | tee "$out/$name.txt"; then
    failed+=("$name")
  fi
  echo "cpu_suite: $name took $((SECONDS - started)) s"
}

if ((quick)); then
  step_args=(--model mlp --warmup 1 --steps 3)
  allreduce_args=(-b 4K -e 64K -n 3 -w 1)
  ddp_args=(--models mlp --iters 3 --warmup 1 --repeats 1 --sweep "" --backends default)
  main_args=(--model mlp --epochs 1 --train-samples 512 --test-samples 256 --log-every 2)
else
  step_args=(--model mlp,cnn)
  allreduce_args=(-b 4K -e 64M -f 4)
  ddp_args=(--repeats 3)
  main_args=(--model cnn --epochs 2 --batch-size 32 --sync-bn --log-every 50)
fi

# step_bench prints its JSON on stdout; the table is drawn from it.
echo "cpu_suite: step_bench: $build/bin/step_bench ${step_args[*]} --json"
if ! "$build/bin/step_bench" "${step_args[@]}" ${peer[@]+--no-peer} --json >"$out/step_bench.json"; then
  failed+=(step_bench)
fi
step allreduce_compare python3 benchmarks/allreduce_compare.py --build "$build" -np 2 "${allreduce_args[@]}" \
  ${peer[@]+"${peer[@]}"} --json "$out/allreduce_compare.json"
step ddp_compare python3 benchmarks/ddp_compare.py --build "$build" "${ddp_args[@]}" \
  ${peer[@]+"${peer[@]}"} --json "$out/ddp_compare.json"
step fashion_mnist "$build/bin/lockstep-run" -np 2 "$build/bin/fashion_mnist" "${main_args[@]}" \
  --log-json "$out/fashion_mnist.json"

scripts/plot-benchmarks "$out" --out "$plots" --prefix cpu- || failed+=(plots)

if ((${#failed[@]})); then
  echo "cpu_suite: failed: ${failed[*]} (their output is in $out)" >&2
  exit 1
fi
echo "cpu_suite: results in $out, plots in $plots"
