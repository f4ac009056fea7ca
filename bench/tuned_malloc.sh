# glibc malloc settings for PyTorch that ../shared/anchors calls "tuned": freed memory is kept rather
# than returned to the OS after every step (as dptrain's storage cache keeps it), so activations are
# not faulted back in. Sourced by the scripts that time PyTorch both as shipped and tuned:
#   env "${TUNED_MALLOC[@]}" /usr/bin/python3 ...
# shellcheck shell=bash disable=SC2034  # used by the scripts that source this file
TUNED_MALLOC=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=68719476736)
