#!/usr/bin/env bash
# JPEG decoding speed on one core: our decode_image (build/bench/decode_bench, files in memory) against
# libjpeg-turbo's djpeg (output to /dev/null) over the same folder of JPEGs, the two interleaved for
# --rounds rounds, each file decoded --repeat times a round; prints the medians in images/s and their
# ratio. djpeg is a process per file, whose start (a few ms) can outweigh the decode of a small image:
# djpeg on a 1x1 JPEG as often is timed too, and djpeg's rate without that cost is shown beside the
# plain one. djpeg and cjpeg come with Debian's libjpeg-turbo-progs (scripts/setup.sh installs it);
# without them the script says so, reports decode_bench alone and exits 1.
#
#   bench/decode_vs_djpeg.sh DIR [--bin BUILD_DIR] [--rounds 3] [--repeat 3]
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$repo_root/build" rounds=3 repeat=3 dir=""
while (($#)); do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    -*) echo "decode_vs_djpeg.sh: unknown option '$1'" >&2; exit 2 ;;
    *) dir="$1"; shift ;;
  esac
done
[[ -d "$dir" ]] || { echo "usage: bench/decode_vs_djpeg.sh DIR [--bin BUILD_DIR] [--rounds N] [--repeat N]" >&2; exit 2; }
decode_bench=""
for candidate in "$bin/bench/decode_bench" "$bin/decode_bench"; do
  [[ -x "$candidate" ]] && { decode_bench=$candidate; break; }
done
[[ -x "$decode_bench" ]] || { echo "decode_vs_djpeg.sh: no decode_bench under $bin (make decode_bench)" >&2; exit 1; }

mapfile -d '' files < <(find "$dir" -type f \( -iname '*.jpg' -o -iname '*.jpeg' \) -print0 | sort -z)
((${#files[@]} > 0)) || { echo "decode_vs_djpeg.sh: no .jpg / .jpeg files under $dir" >&2; exit 1; }
cat "${files[@]}" >/dev/null  # both sides read from the page cache

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p')"
echo "${#files[@]} JPEG files under $dir, $(du -ch "${files[@]}" | tail -1 | cut -f1); decoded $repeat times a round"
have_djpeg=1
if ! command -v djpeg >/dev/null || ! command -v cjpeg >/dev/null; then
  have_djpeg=0
  echo "djpeg / cjpeg NOT FOUND: install libjpeg-turbo-progs (scripts/setup.sh does) for the comparison;" \
    "decode_bench alone below"
else
  echo "djpeg: $(djpeg -version 2>&1 | head -1)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  printf 'P5 1 1 255\n\x80' | cjpeg >"$tmp/tiny.jpg"
fi

now() { date +%s.%N; }
# calc FORMAT EXPRESSION VAR=VALUE...: awk arithmetic on the named values, printed with FORMAT.
calc() {
  local format=$1 expression=$2 args=() a
  shift 2
  for a in "$@"; do args+=(-v "$a"); done
  awk "${args[@]}" "BEGIN { printf \"$format\", $expression }" </dev/null
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# Seconds for `repeat` passes of djpeg over the given files.
time_djpeg() {
  local t0 r f
  t0=$(now)
  for ((r = 0; r < repeat; ++r)); do
    for f in "$@"; do djpeg -outfile /dev/null "$f"; done
  done
  calc %.6f "t1 - t0" t0="$t0" t1="$(now)"
}

n=$((${#files[@]} * repeat))
ours=() djpeg=() net=()
for ((round = 1; round <= rounds; ++round)); do
  ours+=("$("$decode_bench" "$dir" --only jpeg --repeat "$repeat" | sed -n 's/.*"images_per_sec":\([0-9.]*\).*/\1/p')")
  line="round $round: decode_bench ${ours[-1]} images/s"
  if ((have_djpeg)); then
    tiny=()
    for ((i = 0; i < ${#files[@]}; ++i)); do tiny+=("$tmp/tiny.jpg"); done
    djpeg_s=$(time_djpeg "${files[@]}")
    start_s=$(time_djpeg "${tiny[@]}")
    djpeg+=("$(calc %.1f "n / d" n="$n" d="$djpeg_s")")
    net+=("$(calc %.1f "(d > s) ? n / (d - s) : 0" n="$n" d="$djpeg_s" s="$start_s")")
    line+=", djpeg ${djpeg[-1]} images/s ($(calc %.1f "n / s" n="$n" s="$start_s")/s on a 1x1 JPEG)"
  fi
  echo "$line"
done

ours_median=$(median "${ours[@]}")
echo "decode_bench (one thread, in memory):  $ours_median images/s (median of $rounds rounds)"
((have_djpeg)) || exit 1
djpeg_median=$(median "${djpeg[@]}") net_median=$(median "${net[@]}")
echo "djpeg (a process per file):            $djpeg_median images/s"
echo "djpeg less a 1x1 JPEG's process start: $net_median images/s"
echo "ratio decode_bench / djpeg: $(calc %.2f "o / d" o="$ours_median" d="$djpeg_median")," \
  "decode_bench / djpeg less process starts: $(calc %.2f "(n > 0) ? o / n : 0" o="$ours_median" n="$net_median")"
