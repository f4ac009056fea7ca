#!/usr/bin/env bash
# Include layering check: every #include "..." goes down the folder order; no cycles among headers.
#
#   scripts/check_layering.sh [SOURCE_ROOT]    (default: the repository this script is in)
#
# Reads every source file (.h .hpp .cuh .cpp .cc .cu ...) under the library folders of SOURCE_ROOT
# and each of its #include "..." lines. Rules:
#   1. Folder order, lowest first:  core  <  layers = data = optim = distributed  <  cuda  <  trainer
#      A file may include headers of its own folder or of a lower level only: nothing of a higher
#      level, and nothing of another folder on its own level (layers, data, optim and distributed are
#      independent of each other; cuda, the backends level, may use all four).
#   2. No include cycles among the project's headers, a header standing for itself and its
#      implementation file (x.h with x.cpp, x.cc or x.cu beside it): within a folder they form a DAG
#      (a cycle across folders needs an include that breaks rule 1, and is reported as that). So no
#      header includes the header of a file above it: if trainer.h includes run.h while run.cpp
#      includes trainer.h, trainer.h sits below run.cpp and above run.h at once.
# bench/ and tests/ are consumers of every folder and are not checked; other folders are not read.
# An include is resolved as the compiler resolves a quoted one: beside the including file first,
# then from SOURCE_ROOT (the one include directory the project sets). One that names none of the
# project's files is a system or third-party header and is passed over. Angle-bracket includes are
# passed over too (<cuda/std/...> is the CUDA toolkit's, not cuda/).
#
# Prints each violation as
#   FILE:LINE: includes "X" (folder A is below folder B)
#   FILE:LINE: includes "X" (folders A and B are on the same level)
#   FILE:LINE: includes "X" (include cycle: X -> ... -> FILE -> X)
# and exits 1; otherwise prints one OK line (files and includes checked) and exits 0. Exit 2: no
# source files under SOURCE_ROOT's library folders (a wrong root must not pass).
# ctest runs it on the tree (ctest -L lint: layering) and on planted violations (layering_selftest).
set -euo pipefail

# The levels, lowest first; folders in one group are on the same level.
levels=("core" "layers data optim distributed" "cuda" "trainer")

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n "2,/^set -/{/^#/p}" "$0" | sed "s/^# \{0,1\}//"
  exit 0
fi
[[ $# -le 1 ]] || { echo "usage: check_layering.sh [SOURCE_ROOT]" >&2; exit 2; }
script_dir=.
[[ ${BASH_SOURCE[0]} == */* ]] && script_dir=${BASH_SOURCE[0]%/*}
root=${1:-$script_dir/..}
[[ -d $root ]] || { echo "check_layering: $root is not a directory" >&2; exit 2; }
cd "$root"

level_map=() folders=()
for i in "${!levels[@]}"; do
  for folder in ${levels[i]}; do
    level_map+=("$folder=$i")
    folders+=("$folder")
  done
done

shopt -s globstar nullglob
files=()
for folder in "${folders[@]}"; do
  for f in "$folder"/**/*.{h,hh,hpp,hxx,cuh,inl,c,cc,cpp,cxx,cu}; do
    [[ -f $f ]] && files+=("$f")
  done
done
if [[ ${#files[@]} -eq 0 ]]; then
  echo "check_layering: no source files under $root/{${folders[*]}}" >&2
  exit 2
fi

# Input 1: the folder levels; input 2: every file; input 3: "FILE:LINE:#include ..." lines.
# (grep exits 1 where no file includes anything: that is no violation.)
awk '
  function norm(p,   parts, n, i, out, k, stack) {  # a/./b/../c -> a/c
    n = split(p, parts, "/"); k = 0
    for (i = 1; i <= n; i++) {
      if (parts[i] == "" || parts[i] == ".") continue
      if (parts[i] == ".." && k > 0 && stack[k] != "..") { k--; continue }
      stack[++k] = parts[i]
    }
    out = ""
    for (i = 1; i <= k; i++) out = out (i > 1 ? "/" : "") stack[i]
    return out
  }
  function top(p) { sub(/\/.*/, "", p); return p }
  function is_header(p) { return p ~ /\.(h|hh|hpp|hxx|cuh|inl)$/ }
  # The header an implementation file implements (x.cpp -> x.h, when x.h exists), else "".
  function own_header(p,   stem) {
    if (is_header(p) || p !~ /\.(c|cc|cpp|cxx|cu)$/) return ""
    stem = p; sub(/\.[^.\/]*$/, "", stem)
    return (stem ".h") in exists ? stem ".h" : ""
  }
  # Depth-first search; a grey node met again closes a cycle, reported at the edge that closes it.
  function dfs(u, depth,   list, n, i, v, j, path) {
    color[u] = 1; stk[depth] = u
    n = split(adj[u], list, " ")
    for (i = 1; i <= n; i++) {
      v = list[i]
      if (color[v] == 1) {
        path = ""
        for (j = depth; j >= 1 && stk[j] != v; j--) ;
        for (; j <= depth; j++) path = path stk[j] " -> "
        printf "%s:%s: includes \"%s\" (include cycle: %s%s)\n", efile[u, v], eline[u, v], einc[u, v], path, v
        violations++
      } else if (color[v] == 0) {
        dfs(v, depth + 1)
      }
    }
    color[u] = 2
  }
  FILENAME == ARGV[1] { split($0, kv, "="); level[kv[1]] = kv[2]; next }
  FILENAME == ARGV[2] { exists[$0] = 1; nfiles++; order[nfiles] = $0; next }
  {
    # FILE:LINE:TEXT (no colons in our paths)
    file = $0; sub(/:.*/, "", file)
    rest = substr($0, length(file) + 2); line = rest; sub(/:.*/, "", line)
    text = substr(rest, length(line) + 2)
    if (!match(text, /"[^"]*"/)) next
    inc = substr(text, RSTART + 1, RLENGTH - 2)
    dir = file; sub(/\/[^\/]*$/, "", dir)
    target = norm(dir "/" inc)
    if (!(target in exists)) {
      target = norm(inc)
      if (!(target in exists) && !(top(target) in level)) next  # not ours
    }
    checked++
    from = top(file); to = top(target)
    if (from != to && level[to] > level[from]) {
      printf "%s:%s: includes \"%s\" (folder %s is below folder %s)\n", file, line, inc, from, to
      violations++; next
    }
    if (from != to && level[to] == level[from]) {
      printf "%s:%s: includes \"%s\" (folders %s and %s are on the same level)\n", file, line, inc, from, to
      violations++; next
    }
    # Only includes that keep the order join the graph: a cycle through one that breaks it is that
    # violation again, reported above.
    node = is_header(file) ? file : own_header(file)
    if (node != "" && node != target && is_header(target) && (target in exists) && !((node, target) in eline)) {
      adj[node] = adj[node] " " target
      efile[node, target] = file; eline[node, target] = line; einc[node, target] = inc
      header_edges++
    }
  }
  END {
    for (i = 1; i <= nfiles; i++) if (is_header(order[i]) && color[order[i]] == 0) dfs(order[i], 1)
    if (violations > 0) {
      fflush()
      printf "check_layering: %d violation%s (scripts/check_layering.sh --help: the rules)\n", violations, violations == 1 ? "" : "s" > "/dev/stderr"
      exit 1
    }
    printf "check_layering: OK: %d files, %d includes of project files (%d between headers and their files, no cycles)\n", nfiles, checked, header_edges
  }
' <(printf '%s\n' "${level_map[@]}") <(printf '%s\n' "${files[@]}") \
  <(grep -H -n -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "${files[@]}" || true)
