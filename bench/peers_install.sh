#!/usr/bin/env bash
# On the H200 machine (no network): installs the wheels bench/peers_fetch.sh left in .whl/peers/ (and
# .whl/peers-part2/) into /tmp/pq/site-packages, as ../shared/anchors/peer_interleaved.py's header says:
# one pip command, --no-index --no-deps, into a folder whose path contains "site-packages" (QuACK
# fingerprints epilogues as library code only there). A device call carries at most 64 MiB, so:
#
#   call 1, carry [".whl/peers"]:        bash bench/peers_install.sh   # stashes them in /tmp/pq/wheels
#   call 2, carry [".whl/peers-part2"]:  bash bench/peers_install.sh   # joins the split wheel, installs
#
# (one call when nothing was split). Then, in each command that uses the peers:
#   source /tmp/pq/env.sh   # PYTHONPATH+=/tmp/pq/site-packages:/tmp/pq/site-packages/nvidia_cutlass_dsl/dsl_packages
#
# Exit 0: installed (or already installed), or part 1 stashed awaiting part 2; 1: an error.
# Environment: PEERS_DIR (default .whl), PQ (default /tmp/pq), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${PEERS_DIR:-.whl}
PQ=${PQ:-/tmp/pq}
PYTHON=${PYTHON:-python3}
if [ -d "$SRC/peers" ]; then
  rm -rf "$PQ/wheels"             # a new set: nothing stays from an earlier fetch
fi
mkdir -p "$PQ/wheels"

carried=
for d in "$SRC/peers" "$SRC/peers-part2"; do
  if [ -d "$d" ] && [ -n "$(ls -A "$d")" ]; then
    cp "$d"/* "$PQ/wheels/"
    carried="$carried $d"
  fi
done
echo "stashed in $PQ/wheels:${carried:- nothing carried this call}"

for part1 in "$PQ"/wheels/*.whl.part1; do
  [ -e "$part1" ] || continue
  whl=${part1%.part1}
  if [ ! -e "$whl.part2" ]; then
    echo "$(basename "$whl"): part 1 stashed; run this again in a call carrying $SRC/peers-part2 to install"
    exit 0
  fi
  cat "$part1" "$whl.part2" > "$whl"
  if ! (cd "$PQ/wheels" && sha256sum --quiet -c "$(basename "$whl").sha256"); then
    echo "error: $(basename "$whl") joined from its parts does not match its sha256 (parts from two fetches?)" >&2
    rm -f "$whl"
    exit 1
  fi
  rm -f "$part1" "$whl.part2" "$whl.sha256"
done
for part2 in "$PQ"/wheels/*.whl.part2; do
  if [ -e "$part2" ]; then
    echo "error: $(basename "$part2") is here but not its part 1: carry $SRC/peers first (a fresh machine loses /tmp)" >&2
    exit 1
  fi
done

shopt -s nullglob
wheels=("$PQ"/wheels/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
  echo "error: no wheels in $PQ/wheels: run bench/peers_fetch.sh here, carry $SRC/peers" >&2
  exit 1
fi
stamp=$(cd "$PQ/wheels" && sha256sum ./*.whl | sha256sum | cut -c1-16)
if [ "$(cat "$PQ/site-packages/.peers-installed" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$PQ/site-packages"
  "$PYTHON" -m pip install --no-index --no-deps --target "$PQ/site-packages" "${wheels[@]}"
  echo "$stamp" > "$PQ/site-packages/.peers-installed"
fi
cat > "$PQ/env.sh" <<EOF
export PYTHONPATH=\${PYTHONPATH:+\$PYTHONPATH:}$PQ/site-packages:$PQ/site-packages/nvidia_cutlass_dsl/dsl_packages
EOF
echo "installed in $PQ/site-packages: ${#wheels[@]} wheels; source $PQ/env.sh to use them"
