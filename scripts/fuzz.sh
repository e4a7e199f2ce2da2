#!/usr/bin/env bash
# Fuzzes the trace reader and analyze/diff (tests/fuzz/trace_fuzz.cpp) with
# libFuzzer under ASan and UBSan, for SECONDS (default 300) on one process:
#   scripts/fuzz.sh [SECONDS] [extra libFuzzer flags...]
# It configures its own build (build/fuzz: clang++, ATTNPROF_FUZZ=ON, CPU
# only), builds trace_fuzz, seeds build/fuzz/corpus from the trace fixtures
# (each torch.profiler fixture gzipped, inflated, and cut to its first events)
# and the saved reproducers of tests/fixtures/fuzz/, and runs. The corpus is
# kept between runs. A finding is written to build/fuzz/artifacts/; the
# script prints how to reproduce and minimise it. Reproducers are plain trace
# files: keep a minimised one in tests/fixtures/fuzz/ and
# fuzz_regressions_test.cpp replays it in the CPU tests.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
shift || true
build=build/fuzz
clangxx=${CLANGXX:-$(command -v clang++ || command -v clang++-14 || true)}
[[ -n $clangxx ]] || { echo "fuzz.sh: clang++ not found (libFuzzer needs clang)" >&2; exit 1; }

if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$clangxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DATTNPROF_FUZZ=ON -DATTNPROF_CUDA=OFF -DATTNPROF_PYTHON=OFF -DATTNPROF_NATIVE_SIMD=OFF -DBUILD_TESTING=OFF
fi
nice -n 10 cmake --build "$build" --target trace_fuzz -j "${FUZZ_BUILD_JOBS:-2}"

corpus=$build/corpus seeds=$build/seeds artifacts=$build/artifacts
mkdir -p "$corpus" "$seeds" "$artifacts"
python3 - "$seeds" tests/fixtures/torch/*.json.gz tests/fixtures/models/*.json.gz <<'PY'
import gzip, json, os, shutil, sys
out = sys.argv[1]
for path in sys.argv[2:]:
    base = os.path.basename(path).removesuffix(".json.gz")
    shutil.copyfile(path, os.path.join(out, base + ".json.gz"))
    text = gzip.open(path, "rb").read()
    if len(text) <= 200_000:
        open(os.path.join(out, base + ".json"), "wb").write(text)
    doc = json.loads(text)
    events = doc.get("traceEvents", [])
    for n in (8, 40):
        doc["traceEvents"] = events[:n]
        with open(os.path.join(out, f"{base}.first{n}.json"), "w") as f:
            json.dump(doc, f, separators=(",", ":"))
PY
[[ -d tests/fixtures/fuzz ]] && cp tests/fixtures/fuzz/* "$seeds"/ 2>/dev/null || true

# One job: the machine is shared. 200 kB holds the largest inflated fixture.
set +e
"$build/trace_fuzz" "$corpus" "$seeds" -max_total_time="$seconds" -max_len=200000 -timeout=10 \
  -rss_limit_mb=2048 -malloc_limit_mb=2048 -dict=tests/fuzz/trace.dict -artifact_prefix="$artifacts/" \
  -print_final_stats=1 "$@"
rc=$?
set -e
if ((rc != 0)); then
  echo
  echo "fuzz.sh: trace_fuzz stopped on a finding (exit $rc); it is in $artifacts/:"
  ls -t "$artifacts" | head -5 | sed 's/^/  /'
  echo "reproduce:  $build/trace_fuzz $artifacts/FILE      (or: attnprof analyze $artifacts/FILE)"
  echo "minimise:   $build/trace_fuzz -minimize_crash=1 -runs=20000 -artifact_prefix=$artifacts/min- $artifacts/FILE"
fi
exit $rc
