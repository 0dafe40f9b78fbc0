#!/usr/bin/env bash
# ctest layers_check_offences: scripts/check-layers, run on a small tree with
# one offence of each rule and files each rule lets pass, names every offence
# with its file and line, and only those, and exits 1.
set -euo pipefail
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT

mkdir -p "$tree"/{scripts,runtime/cuda,runtime/data,runtime/no_cuda,distributed,collectives,nn/detail,optim,train,models,launcher,benchmarks,examples,include}
cp "$source_dir/scripts/check-layers" "$tree/scripts/"
put() { printf '%b' "$2" >"$tree/$1"; }

# Allowed: CUDA inside its backend, its stand-in and the registration point;
# includes down the layers; detail/ headers from a .cpp or from detail/.
put runtime/cuda/kernel.cu '#include <cuda_runtime.h>\n'
put runtime/no_cuda/stub.cpp '#if LOCKSTEP_HAVE_CUDA\n#endif\n'
put collectives/backend_registry.cpp '#if LOCKSTEP_HAVE_CUDA\n#endif\n'
put nn/module.h '#include "lockstep/collectives/group.h"\n'
put nn/detail/impl.h '#include "lockstep/nn/detail/more.h"\n'
put nn/module.cpp '#include "lockstep/nn/detail/impl.h"\n'
put runtime/data/loader.cpp '#include "lockstep/runtime/data/loader.h"\n'
# Offences, one per rule.
put benchmarks/bench.cpp '#include <vector>\n#include <nccl.h>\n'
put runtime/tensor.cpp '#include "lockstep/nn/module.h"\n'
put runtime/ops.cpp '\n\n#include "lockstep/runtime/data/loader.h"\n'
put runtime/a.h '#include "lockstep/runtime/b.h"\n'
put runtime/b.h '#include "lockstep/runtime/a.h"\n'
put nn/layer.h '#include <string>\n#include "lockstep/nn/detail/impl.h"\n'

status=0
output=$(bash "$tree/scripts/check-layers" 2>&1) || status=$?
echo "$output"
expected=(
  "benchmarks/bench.cpp:2: names CUDA outside its backend (#include <nccl.h>)"
  "runtime/tensor.cpp:1: runtime includes a layer it does not use (runtime allowed): #include \"lockstep/nn/module.h\""
  "runtime/ops.cpp:3: includes runtime/data/, which sits on top of the rest of runtime"
  "runtime/a.h: is part of a header include cycle"
  "runtime/b.h: is part of a header include cycle"
  "nn/layer.h:2: an installed header includes a detail/ header"
  "check-layers: 6 offence(s)"
)
failed=0
for line in "${expected[@]}"; do
  if ! grep -qF -- "$line" <<<"$output"; then
    echo "layers_check_offences: missing from check-layers' output: $line"
    failed=1
  fi
done
if [ "$status" -ne 1 ]; then
  echo "layers_check_offences: check-layers exited $status, not 1"
  failed=1
fi
exit $failed
