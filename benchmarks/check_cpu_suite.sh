#!/usr/bin/env bash
# ctest's cpu_suite_quick: runs benchmarks/cpu_suite.sh --quick into a
# scratch directory and checks that every benchmark left its JSON and every
# plot was drawn (a PNG), with the training log holding its windows and epoch.
#
#   benchmarks/check_cpu_suite.sh BUILD_DIR SCRATCH_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 has no matplotlib (scripts/setup installs python3-matplotlib)"
  exit 0
fi
rm -rf "$work"
mkdir -p "$work"
"$here/cpu_suite.sh" --quick --build "$build" --out "$work/results" --plots "$work/plots"

status=0
for json in step_bench allreduce_compare ddp_compare fashion_mnist; do
  if ! /usr/bin/python3 -c 'import json, sys; json.load(open(sys.argv[1]))' \
      "$work/results/$json.json"; then
    echo "check_cpu_suite: $work/results/$json.json is missing or not JSON"
    status=1
  fi
done
for png in allreduce-busbw ddp-scaling step-time training-curve; do
  file=$work/plots/cpu-$png.png
  if [ "$(head -c 8 "$file" 2>/dev/null | od -An -tx1 | tr -d ' \n')" != 89504e470d0a1a0a ]; then
    echo "check_cpu_suite: $file is missing or not a PNG"
    status=1
  fi
done
# The quick main job: 512 samples at 2 x 64 per step is 4 steps, logged every 2.
/usr/bin/python3 - "$work/results/fashion_mnist.json" <<'PY' || status=1
import json, sys
doc = json.load(open(sys.argv[1]))
steps = [w["step"] for w in doc["windows"]]
epochs = doc["epochs"]
ok = (steps == [2, 4] and len(epochs) == 1 and epochs[0]["step"] == 4
      and 0.0 <= epochs[0]["test_accuracy"] <= 1.0 and doc["settings"]["ranks"] == 2)
if not ok:
    print(f"check_cpu_suite: unexpected training log: windows at {steps}, epochs {epochs}")
sys.exit(0 if ok else 1)
PY
exit $status
