#!/usr/bin/env bash
# On the GPU machine: the Python module (CPU-only, with debug info) on the
# numpy input that crashed it there (a view whose head_dim is strided), under
# segv_backtrace.so; prints the native stack resolved by addr2line.
set -uo pipefail
cd "$(dirname "$0")/../.."
gcc -shared -fPIC -O1 -o /tmp/segv_backtrace.so scripts/debug/segv_backtrace.c || exit 1
if ! python3 -c 'import nanobind' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nanobind-*.whl &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
B=build/pydbg
cmake -S . -B $B -G Ninja -DATTNPROF_CUDA=OFF -DATTNPROF_PYTHON=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" >/tmp/pydbg-cfg.txt 2>&1 || { tail -20 /tmp/pydbg-cfg.txt; exit 1; }
cmake --build $B --target _core -j"$(nproc)" >/tmp/pydbg-build.txt 2>&1 || { grep -E 'error' -A3 /tmp/pydbg-build.txt | head -30; exit 1; }
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
python3 -c 'import numpy, sys; print("python", sys.version.split()[0], "numpy", numpy.__version__)'
for snippet in \
  "q = np.ones((1, 2, 16, 64), np.float32)[..., ::2]" \
  "q = np.ones((1, 2, 32, 32), np.float32)[:, :, ::2]" \
  "q = np.ones((1, 2, 16, 32), np.float32)[:, :, ::-1]"; do
  echo "== $snippet"
  PYTHONPATH=$B/python:${PYTHONPATH:-} LD_PRELOAD=/tmp/segv_backtrace.so python3 -X faulthandler -c "
import numpy as np, attnprof
from attnprof import _core
$snippet
k = np.ones((1, 2, 16, 32), np.float32)
print('strides', q.strides, 'flags', q.flags.c_contiguous)
try:
    print(_core._views(q, k, k, np.empty((1, 2, 16, 32), np.float32), False))
except Exception as e:
    print('views raised', type(e).__name__, e)
try:
    attnprof.attention(q, k, k)
except Exception as e:
    print('attention raised', type(e).__name__, e)
" >/tmp/crash.txt 2>&1
  echo "rc $?"
  cat /tmp/crash.txt | grep -v '^segv-frame' | head -30
  grep '^segv-frame' /tmp/crash.txt | head -40 | while read -r _ where sym; do
    obj=${where%+*}; off=${where##*+}
    echo "-- $where $sym"
    [[ -f $obj ]] && addr2line -f -C -i -e "$obj" "$off" 2>/dev/null | paste - - | head -3
  done
done
