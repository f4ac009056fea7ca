#!/usr/bin/env bash
# Self-test of scripts/check_layering.sh (ctest: layering_selftest): planted violations must fail it, by name.
#
#   check_layering_test.sh SOURCE_DIR SCRATCH_DIR
#
# Builds small fixture trees under SCRATCH_DIR (a clean one, then one planted violation each: an
# include up the folder order, one sideways within a level, one up through "../", a header cycle, a
# header that includes the header of a file above it) and
# a copy of SOURCE_DIR's library folders with an upward include planted in core/tensor.h. Each must
# make the check exit 1 and print the planted FILE:LINE with its reason; the clean fixture must pass,
# with bench/, tests/, angle-bracket and third-party includes left alone; a root with no sources must
# exit 2. So the layering test cannot pass by reading nothing.
set -euo pipefail
src=${1:?usage: check_layering_test.sh SOURCE_DIR SCRATCH_DIR}
scratch=${2:?usage: check_layering_test.sh SOURCE_DIR SCRATCH_DIR}
check="$src/scripts/check_layering.sh"
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# run_check ROOT: the check's exit status in $rc, its output (both streams) in $out.
run_check() {
  rc=0
  out=$(bash "$check" "$1" 2>&1) || rc=$?
  echo "$out" | sed 's/^/    /'
}

# expect_violation CASE ROOT LINE: exit 1 and LINE (an exact line of the report) in the output.
expect_violation() {
  echo "-- $1"
  run_check "$2"
  [[ $rc == 1 ]] || fail "$1: exit $rc, expected 1"
  grep -qxF -- "$3" <<<"$out" || fail "$1: the report does not say: $3"
}

# fixture DIR: a clean tree, one or two files per level, the exempt folders and outside headers.
fixture() {
  rm -rf "$1"
  mkdir -p "$1"/{core,layers,data,optim,distributed,cuda,trainer,bench,tests/core}
  cd "$1"
  printf '#pragma once\n#include <vector>\n' >core/tensor.h
  printf '#pragma once\n#include "tensor.h"\n#include "Eigen/Core"\n' >core/ops.h  # beside it; Eigen's
  printf '#pragma once\n#include "core/ops.h"\n' >layers/module.h
  printf '#include "layers/module.h"\n#include "core/tensor.h"\n' >layers/module.cpp
  printf '#pragma once\n#include "core/tensor.h"\n' >data/dataset.h
  printf '#pragma once\n#include "core/tensor.h"\n' >optim/optimizer.h
  printf '#pragma once\n#include "core/tensor.h"\n' >distributed/communicator.h
  printf '#pragma once\n#include "distributed/communicator.h"\n#include "core/ops.h"\n' >cuda/runtime.h
  printf '#include <cuda/std/atomic>\n#include "cuda/runtime.h"\n' >cuda/kernels.cu
  printf '#pragma once\n#include "layers/module.h"\n#include "data/dataset.h"\n#include "optim/optimizer.h"\n' \
    >trainer/train.h
  printf '#include "trainer/train.h"\n#include "cuda/runtime.h"\n' >trainer/train.cpp
  printf '#include "trainer/train.h"\n' >tests/core/tensor_test.cpp
  printf '#include "trainer/train.h"\n#include "tests/core/tensor_test.cpp"\n' >bench/bench.cpp
  cd - >/dev/null
}

rm -rf "$scratch"
mkdir -p "$scratch"

echo "-- a clean tree passes"
fixture "$scratch/clean"
run_check "$scratch/clean"
[[ $rc == 0 ]] || fail "clean tree: exit $rc, expected 0"
grep -q '^check_layering: OK: 11 files, 15 includes of project files' <<<"$out" ||
  fail "clean tree: no OK line counting its 11 files and 15 includes"

fixture "$scratch/up"
echo '#include "trainer/train.h"' >>"$scratch/up/core/ops.h"
expect_violation "core includes trainer" "$scratch/up" \
  'core/ops.h:4: includes "trainer/train.h" (folder core is below folder trainer)'

fixture "$scratch/backend"
echo '#include "cuda/runtime.h"' >>"$scratch/backend/distributed/communicator.h"
expect_violation "distributed includes cuda" "$scratch/backend" \
  'distributed/communicator.h:3: includes "cuda/runtime.h" (folder distributed is below folder cuda)'

fixture "$scratch/sideways"
echo '#include "optim/optimizer.h"' >>"$scratch/sideways/distributed/communicator.h"
expect_violation "distributed includes optim" "$scratch/sideways" \
  'distributed/communicator.h:3: includes "optim/optimizer.h" (folders distributed and optim are on the same level)'

fixture "$scratch/relative"
echo '#include "../cuda/runtime.h"' >>"$scratch/relative/layers/module.cpp"
expect_violation "layers includes ../cuda" "$scratch/relative" \
  'layers/module.cpp:3: includes "../cuda/runtime.h" (folder layers is below folder cuda)'

fixture "$scratch/cycle"
printf '#pragma once\n#include "core/b.h"\n' >"$scratch/cycle/core/a.h"
printf '#pragma once\n#include "core/tensor.h"\n#include "core/a.h"\n' >"$scratch/cycle/core/b.h"
expect_violation "core/a.h and core/b.h include each other" "$scratch/cycle" \
  'core/b.h:3: includes "core/a.h" (include cycle: core/a.h -> core/b.h -> core/a.h)'

# trainer/trainer.h (included by trainer/train.cpp) includes train.h, the header of train.cpp: the
# private header sits above its implementation and below it at once.
fixture "$scratch/above"
printf '#pragma once\n#include "trainer/train.h"\n' >"$scratch/above/trainer/trainer.h"
echo '#include "trainer/trainer.h"' >>"$scratch/above/trainer/train.cpp"
expect_violation "trainer.h includes the header of train.cpp, which includes it" "$scratch/above" \
  'trainer/trainer.h:2: includes "trainer/train.h" (include cycle: trainer/train.h -> trainer/trainer.h -> trainer/train.h)'

# The real tree, copied with its folders' sources only, and one include planted.
echo "-- the source tree's copy with core/tensor.h including trainer/trainer.h"
real="$scratch/real"
mkdir -p "$real"
(cd "$src" && for d in core layers data optim distributed cuda trainer; do
  [[ -d $d ]] || continue
  find "$d" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print
done) | (cd "$src" && xargs cp --parents -t "$real")
echo '#include "trainer/trainer.h"' >>"$real/core/tensor.h"
line=$(wc -l <"$real/core/tensor.h")
expect_violation "real tree, planted" "$real" \
  "core/tensor.h:$line: includes \"trainer/trainer.h\" (folder core is below folder trainer)"

echo "-- a root without sources"
mkdir -p "$scratch/empty/docs"
run_check "$scratch/empty"
[[ $rc == 2 ]] || fail "empty root: exit $rc, expected 2"

if [[ $failures -gt 0 ]]; then
  echo "check_layering_test: $failures failure(s)"
  exit 1
fi
echo "check_layering_test: all cases behave"
