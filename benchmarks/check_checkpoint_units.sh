#!/usr/bin/env bash
# ctest's checkpoint_bench_units: checkpoint_bench's sizes are MiB (2^20
# bytes) and labelled so in its table and JSON, beside rates in MB/s; and it
# writes in a directory of its own inside --dir, removed at the end, a failed
# write's included, leaving the user's files there as they were.
#
#   benchmarks/check_checkpoint_units.sh BUILD_DIR SCRATCH_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
rm -rf "$work"
mkdir -p "$work/dir"
echo "user's" >"$work/dir/bench.safetensors"
echo "user's" >"$work/dir/plain.bin"
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
left_as_was() {
  [ "$(ls "$work/dir")" = "$(printf 'bench.safetensors\nplain.bin')" ] &&
    [ "$(cat "$work/dir/bench.safetensors" "$work/dir/plain.bin")" = "$(printf "user's\nuser's")" ] ||
    { echo "check_checkpoint_units: --dir holds, after $1:"; ls -la "$work/dir"; exit 1; }
}
left_as_was "a run"
# A write that fails (files limited to 1 MiB; the signal ignored, so write
# fails with EFBIG as on a full disk): an error, and nothing left behind.
if (trap '' XFSZ; ulimit -f 1024; "$build/bin/checkpoint_bench" --dir "$work/dir" --sizes 2 \
      --iters 1 --warmup 0 --hot >"$work/failed.txt" 2>&1); then
  echo "check_checkpoint_units: a 2 MiB run succeeded with files limited to 1 MiB"; exit 1
fi
left_as_was "a failed write"
echo "check_checkpoint_units: sizes are MiB in the table and the JSON; --dir is left as it was"
