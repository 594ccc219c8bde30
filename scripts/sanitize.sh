#!/usr/bin/env bash
# Build the engine with AddressSanitizer + UndefinedBehaviorSanitizer into its own build dir and run the engine
# tests against it. Exit 0 only when the tests pass and neither sanitizer reported anything.
#
#   scripts/sanitize.sh                       # the default engine test set
#   scripts/sanitize.sh tests/models/test_gguf.py    # chosen tests (paths relative to the repo root)
#   SANITIZE=address scripts/sanitize.sh      # only ASan; JOBS=4 for a parallel build
#
# How: cmake -DPYSERVE_SANITIZE=address,undefined into build-sanitize/; the extension lands in
# build-sanitize/py/pyserve/ beside a copy of the Python package, and pytest runs from build-sanitize/py so
# that this pyserve is the one imported (in subprocesses too). Python itself is not instrumented: libasan is
# preloaded, and leak detection is off (the interpreter's own allocations would drown the report).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build-sanitize}"
SANITIZE="${SANITIZE:-address,undefined}"
JOBS="${JOBS:-1}"
PY="${PYTHON:-python3}"
LOG="$BUILD/sanitize.log"

DEFAULT_TESTS=(tests/models/test_gguf.py tests/models/test_gguf_fuzz.py tests/kernels/test_quant.py tests/kernels/test_sampler.py
               tests/engine/test_block_manager.py tests/engine/test_scheduler.py tests/engine/test_engine.py tests/engine/test_prefix_cache.py
               tests/engine/test_n_samples.py tests/models/test_arch_logits.py tests/kernels/test_packed.py)
if [ "$#" -gt 0 ]; then TESTS=("$@"); else TESTS=("${DEFAULT_TESTS[@]}"); fi

mkdir -p "$BUILD/py"
PYBIND11_DIR="$("$PY" -c 'import pybind11; print(pybind11.get_cmake_dir())')"
echo "== configure + build ($SANITIZE) in $BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -Dpybind11_DIR="$PYBIND11_DIR" \
      -DPYSERVE_SANITIZE="$SANITIZE" -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$BUILD/py/pyserve" >/dev/null
cmake --build "$BUILD" --parallel "$JOBS"

# the Python package beside the instrumented extension (copies: Path(pyserve.__file__).resolve() must stay here)
# (the whole tree: the package has subpackages, engine/ api/ server/ bench/, and data files)
find "$BUILD/py/pyserve" -type f ! -name '_engine*.so' -delete 2>/dev/null || true
(cd "$ROOT" && find pyserve -type f ! -name '_engine*.so' ! -path '*/__pycache__/*' -exec cp --parents {} "$BUILD/py/" \;)
ls "$BUILD"/py/pyserve/_engine*.so >/dev/null

RUNTIMES=()
case "$SANITIZE" in *address*) RUNTIMES+=("$(${CXX:-c++} -print-file-name=libasan.so)");; esac
case "$SANITIZE" in *undefined*) RUNTIMES+=("$(${CXX:-c++} -print-file-name=libubsan.so)");; esac
PRELOAD="$(IFS=:; echo "${RUNTIMES[*]}")"

ABS_TESTS=()
for t in "${TESTS[@]}"; do case "$t" in /*) ABS_TESTS+=("$t");; *) ABS_TESTS+=("$ROOT/$t");; esac; done

echo "== pytest under $SANITIZE (LD_PRELOAD=$PRELOAD)"
set +e
(
  cd "$BUILD/py"
  export LD_PRELOAD="$PRELOAD"
  export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0:strict_string_checks=1:check_initialization_order=1:print_summary=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=0:report_error_type=1"
  export PYTHONPATH="$BUILD/py"
  export PYSERVE_FUZZ_SECONDS="${PYSERVE_FUZZ_SECONDS:-10}"
  export PYTHONMALLOC=malloc  # Python's small-object allocator would hide heap errors from ASan
  "$PY" -c 'import pyserve, sys; from pyserve import _engine; print("pyserve from", pyserve.__file__, "engine", _engine.__file__)'
  "$PY" -m pytest -q -p no:cacheprovider "${ABS_TESTS[@]}"
) 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
set -e

reports=$(grep -cE "ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer|SUMMARY: (Address|UndefinedBehavior)Sanitizer" "$LOG" || true)
echo "== pytest exit $rc; sanitizer reports: $reports (log: $LOG)"
if [ "$reports" != "0" ]; then
  grep -nE -A12 "ERROR: AddressSanitizer|runtime error:" "$LOG" | head -80
  exit 1
fi
exit "$rc"
