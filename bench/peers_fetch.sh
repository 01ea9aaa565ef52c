#!/usr/bin/env bash
# Downloads the peers' wheels for the H200 machine (Python 3.12, manylinux x86_64; it has no network)
# into .whl/peers/: QuACK and Liger with what they need beyond the machine's image, the versions of
# ../shared/anchors/peer_interleaved.py's header. A device call carries at most 64 MiB, so when they
# add up to more than PEERS_BUDGET_BYTES the largest wheel (nvidia-cutlass-dsl-libs-cu13, 92 MB) is
# split so that each call carries about half: its head stays in .whl/peers/ and the rest goes to
# .whl/peers-part2/, with the whole wheel's sha256, for a second call. bench/peers_install.sh joins and installs them there.
#
#   bash bench/peers_fetch.sh [extra pip download arguments]
#
# Environment: PEERS_DIR (default .whl), PEERS_SPECS (the requirements), PEERS_BUDGET_BYTES (default
# 60 MiB: room under 64 MiB for the working tree's own files), PYTHON (a python with pip).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${PEERS_DIR:-.whl}
BUDGET=${PEERS_BUDGET_BYTES:-$((60 * 1024 * 1024))}
SPECS=${PEERS_SPECS:-"quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2
  torch-c-dlpack-ext==0.1.5 liger-kernel==0.8.5 packaging==26.4"}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

rm -rf "$DEST/peers" "$DEST/peers-part2"
mkdir -p "$DEST/peers" "$DEST/peers-part2"
# shellcheck disable=SC2086  # SPECS is a list of requirements
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$DEST/peers" $SPECS "$@"

size() { stat -c %s "$1"; }
total=0
largest=
for w in "$DEST"/peers/*.whl; do
  total=$((total + $(size "$w")))
  if [ -z "$largest" ] || [ "$(size "$w")" -gt "$(size "$largest")" ]; then largest=$w; fi
done
if [ "$total" -gt "$BUDGET" ]; then
  # the two calls carry about half each: the most room left for the working tree's files
  others=$((total - $(size "$largest")))
  head_bytes=$(((total + 1) / 2 - others))
  rest=$(($(size "$largest") - head_bytes))
  if [ "$head_bytes" -le 0 ] || [ "$rest" -gt "$BUDGET" ]; then
    echo "error: the wheels ($total bytes) do not fit in two calls of $BUDGET bytes" >&2
    exit 1
  fi
  name=$(basename "$largest")
  (cd "$DEST/peers" && sha256sum "$name") > "$DEST/peers-part2/$name.sha256"
  head -c "$head_bytes" "$largest" > "$DEST/peers/$name.part1"
  tail -c "+$((head_bytes + 1))" "$largest" > "$DEST/peers-part2/$name.part2"
  rm "$largest"
  echo "split $name: $head_bytes bytes in $DEST/peers/, $rest in $DEST/peers-part2/"
else
  rmdir "$DEST/peers-part2"
fi
du -sb "$DEST"/peers*
echo "next, on the H200: bash bench/peers_install.sh in a call carrying $DEST/peers" \
     "$( [ -d "$DEST/peers-part2" ] && echo ", then again in a call carrying $DEST/peers-part2" )"
