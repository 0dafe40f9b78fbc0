#!/usr/bin/env bash
# ctest's checkpoint_bench_units: checkpoint_bench's sizes are MiB (2^20
# bytes) and labelled so in its table and JSON, beside rates in MB/s.
#
#   benchmarks/check_checkpoint_units.sh BUILD_DIR SCRATCH_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
rm -rf "$work"
mkdir -p "$work"
"$build/bin/checkpoint_bench" --dir "$work/dir" --sizes 1,2 --iters 1 --warmup 0 --hot \
  --json "$work/result.json" >"$work/table.txt"
grep -q "^| MiB " "$work/table.txt" || { echo "check_checkpoint_units: no MiB column:"; \
  cat "$work/table.txt"; exit 1; }
/usr/bin/python3 - "$work/result.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for r in doc["results"]:
    mib = r.get("size_mib")
    # The file: the tensors' bytes and a small header.
    if mib is None or not mib << 20 <= r["bytes"] < (mib << 20) + (1 << 16):
        sys.exit(f"check_checkpoint_units: {mib} MiB labels a checkpoint of {r['bytes']} bytes")
PY
echo "check_checkpoint_units: sizes are MiB in the table and the JSON"
