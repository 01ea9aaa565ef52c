#!/usr/bin/env bash
# The two set-up commands of the README.
#   ./dev.sh setup   make .venv, install torch (CPU build) and epic (non-editable, as users get it),
#                    then the main job: compile samples/residual_rmsnorm.epi to CUDA in out/ and
#                    build it with nvcc into the kernel cache (no GPU needed)
#   ./dev.sh test    run the test suite (GPU tests skip themselves without CUDA) in 2 processes
#                    (EPIC_TEST_WORKERS=N for N, 0 for one process)
#   ./dev.sh mutation  the mutation score (slow: about 2 hours on 2 cores; not part of CI), in a
#                    copy of HEAD under ${EPIC_MUTATION_DIR:-/tmp/epic-mutation}; configuration in
#                    pyproject.toml [tool.mutmut]; results in tests/mutation/README.md
set -euo pipefail
cd "$(dirname "$0")"
VENV=${EPIC_VENV:-.venv}

case "${1:-}" in
  setup)
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    # torch first: 2.13.0 is the small CPU build; a bare `torch` requirement would pull a 5 GB CUDA build.
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q "torch==2.13.0" || "$VENV/bin/python" -m pip install -q torch
    "$VENV/bin/python" -m pip install -q ".[test]"
    if command -v nvcc >/dev/null 2>&1 && [ -z "${EPIC_SKIP_BUILD:-}" ]; then
      "$VENV/bin/epic" compile samples/residual_rmsnorm.epi -o out/ --build
    else
      "$VENV/bin/epic" compile samples/residual_rmsnorm.epi -o out/
      echo "nvcc not found (or EPIC_SKIP_BUILD set): generated CUDA in out/, not built"
    fi
    ;;
  test)
    shift
    # run from tests' parent with the installed package (not the source tree) on the path; in
    # EPIC_TEST_WORKERS processes (default 2: the nvcc tests run parallel nvcc themselves, and each
    # nvcc of a CUTLASS kernel takes about 2 GB); worksteal evens out the long nvcc tests
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider -n "${EPIC_TEST_WORKERS:-2}" --dist worksteal "$@"
    ;;
  mutation)
    shift
    "$VENV/bin/python" -m pip install -q ".[mutation]"
    DIR=${EPIC_MUTATION_DIR:-/tmp/epic-mutation}
    rm -rf "$DIR" && mkdir -p "$DIR"
    git archive HEAD | tar -x -C "$DIR"
    MM="$PWD/$VENV/bin/mutmut"
    # one torch thread: mutmut forks per mutant, and a forked torch thread pool crashes (a false "segfault")
    export OMP_NUM_THREADS=1
    if [ "${1:-}" = "--sample" ]; then
      # a uniform random sample of all mutants (tests/mutation/README.md): N mutants, fixed seed
      N=${2:-800}; SEED=${3:-2026}
      (cd "$DIR" && "$MM" run --max-children "$(getconf _NPROCESSORS_ONLN)" epic.layouts.x_packed_int4_shape__mutmut_1 >/dev/null 2>&1 || true
       "$MM" results --all true | tests/mutation/sample.py "$N" "$SEED" > sample.txt
       "$MM" run --max-children "$(getconf _NPROCESSORS_ONLN)" $(cat sample.txt) >/dev/null 2>&1 || true
       "$MM" results --all true | tests/mutation/score.py --only sample.txt)
    else
      (cd "$DIR" && "$MM" run --max-children "$(getconf _NPROCESSORS_ONLN)" "$@" >/dev/null 2>&1 || true
       "$MM" results --all true | tests/mutation/score.py)
    fi
    ;;
  *)
    echo "usage: ./dev.sh setup | ./dev.sh test [pytest args] | ./dev.sh mutation [--sample N SEED | MUTANT...]" >&2
    exit 2
    ;;
esac
