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
# or core/half.h. Prints one OK line, or each failing compiler's output, exiting 1. Exit 2: no such
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
echo "check_isa_variants.sh: OK: $sources source(s) compile with -Werror for -march=${marches[*]}"
