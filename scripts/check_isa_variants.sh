#!/usr/bin/env bash
# Compiles the vector-ISA-dependent sources for the other x86-64 targets the project ships to, with
# the build's own flags and -Werror, at -O0 into /dev/null: an intrinsic outside its #if fails only
# where code is generated (GCC's "inlining failed ... target specific option mismatch"), so syntax
# alone (-fsyntax-only) would pass it.
#
#   scripts/check_isa_variants.sh BUILD_DIR [MARCH ...]
#       (default MARCHes: x86-64 x86-64-v3 sapphirerapids)
#
# A build compiles for its host (-march=native), so CI on an AVX-512 machine never sees the AVX2 or
# the SSE2 branches of core/cpu/ and core/half: a portable build (-DDPTRAIN_NATIVE=OFF, the GPU
# bundle's) once failed on a parameter only the AVX branches used, found only when the bundle was
# next built. x86-64 is that portable build; x86-64-v3 the AVX2/FMA/F16C kind (AMD EPYC Zen 3);
# sapphirerapids the AVX-512 kinds (the Intel Xeon with BF16 and AMX; Zen 4/5 take the same branches).
# Reads BUILD_DIR/compile_commands.json (CMake writes it at configure). A source is checked when it,
# or a file it includes directly (a unity file's sources), tests an ISA macro or includes core/cpu/
# or core/half.h. A -march whose tested ISA macros are the build's own is skipped (the build compiled
# those branches already). Prints one OK line, or each failing compiler's output, exiting 1. Exit 2: no such
# build, or nothing to check (a wrong folder must not pass). ctest: isa_variants (label lint).
set -euo pipefail
build=${1:?usage: check_isa_variants.sh BUILD_DIR [MARCH ...]}
shift
marches=("$@")
((${#marches[@]})) || marches=(x86-64 x86-64-v3 sapphirerapids)
database="$build/compile_commands.json"
[[ -f $database ]] || { echo "check_isa_variants.sh: no $database (configure $build with CMake first)" >&2; exit 2; }

isa_pattern='__AVX|__F16C__|__FMA__|__SSE|#include "core/cpu/|#include "core/half\.h"'
depends_on_isa() {
  local source=$1 included
  grep -qE "$isa_pattern" "$source" && return 0
  # Unity files hold only #include lines of absolute paths.
  while IFS= read -r included; do
    [[ -f $included ]] && grep -qE "$isa_pattern" "$included" && return 0
  done < <(sed -n 's/^#include "\(\/.*\)"$/\1/p' "$source")
  return 1
}

# CMake writes one key per line: "directory", "command", "file" (and "output"), JSON-escaped.
unescape() { local s=${1//\\\"/\"}; printf '%s' "${s//\\\\/\\}"; }
jobs_file=$(mktemp)
trap 'rm -f "$jobs_file"' EXIT
directory='' command=''
while IFS= read -r line; do
  case $line in
    *'"directory": "'*) directory=$(unescape "$(sed 's/^ *"directory": "\(.*\)",\{0,1\}$/\1/' <<<"$line")") ;;
    *'"command": "'*) command=$(unescape "$(sed 's/^ *"command": "\(.*\)",\{0,1\}$/\1/' <<<"$line")") ;;
    *'"file": "'*)
      file=$(unescape "$(sed 's/^ *"file": "\(.*\)",\{0,1\}$/\1/' <<<"$line")")
      [[ $file == *.cu ]] && continue  # nvcc's: no host ISA branches
      depends_on_isa "$file" || continue
      # Without its output file, and without -march=native: the one given below is the one in force.
      command=$(sed -e 's/ -o [^ ]*//' -e 's/ -march=native//' <<<"$command")
      for march in "${marches[@]}"; do printf '%s\t%s\t%s\t%s\n' "$march" "$directory" "$file" "$command"; done >>"$jobs_file"
      ;;
  esac
done <"$database"
sources=$(cut -f3 "$jobs_file" | sort -u | wc -l)
((sources > 0)) || { echo "check_isa_variants.sh: no ISA-dependent source in $database" >&2; exit 2; }

# A -march that defines the same ISA macros the sources test as the build's own target takes the
# branches the build itself compiled: skipped (on the Zen 3 kind x86-64-v3, on the Intel kind
# sapphirerapids), which saves a third of the time.
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
macro_pattern='__(AVX[A-Z0-9_]*|F16C|FMA|SSE[0-9_]*|AMX[A-Z0-9_]*)__'
tested_macros=$(grep -rhoE "$macro_pattern" "$repo_root"/{core,layers,data,optim,distributed,trainer,tests,bench,tools} \
  --include='*.h' --include='*.cpp' | sort -u)
compiler=$(head -1 "$jobs_file" | cut -f4 | awk '{print $1}')
build_march=$(grep -q -- '-march=native' "$database" && echo native || echo x86-64)
macros_for() {  # the tested ISA macros that -march=$1 defines
  "$compiler" -march="$1" -dM -E -x c++ /dev/null | grep -oE "$macro_pattern" | sort -u | grep -Fx -f <(echo "$tested_macros") || true
}
built=$(macros_for "$build_march")
checked=() skipped=()
for march in "${marches[@]}"; do
  if [[ $(macros_for "$march") == "$built" ]]; then skipped+=("$march"); else checked+=("$march"); fi
done
((${#checked[@]})) || { echo "check_isa_variants.sh: OK: every -march given takes the build's own branches (-march=$build_march)"; exit 0; }
awk -F'\t' -v keep="${checked[*]}" 'BEGIN { n = split(keep, k, " "); for (i = 1; i <= n; ++i) want[k[i]] = 1 } $1 in want' \
  "$jobs_file" >"$jobs_file.kept" && mv "$jobs_file.kept" "$jobs_file"

check_one() {
  local march=$1 directory=$2 file=$3 command=$4 output
  if ! output=$(cd "$directory" && eval "$command -march=$march -O0 -S -o /dev/null" 2>&1); then
    printf '== -march=%s: %s ==\n%s\n' "$march" "$file" "$output"
    return 1
  fi
}
export -f check_one
failed=0
while IFS=$'\t' read -r march directory file command; do
  printf '%s\0%s\0%s\0%s\0' "$march" "$directory" "$file" "$command"
done <"$jobs_file" | xargs -0 -n 4 -P "${DPTRAIN_JOBS:-2}" bash -c 'check_one "$@"' _ || failed=1
if ((failed)); then
  echo "check_isa_variants.sh: FAILED: the errors above; a branch for another vector ISA needs the fix" >&2
  exit 1
fi
note=''
((${#skipped[@]})) && note=" (skipped ${skipped[*]}: the same branches as the build, -march=$build_march)"
echo "check_isa_variants.sh: OK: $sources source(s) compile with -Werror for -march=${checked[*]}$note"
