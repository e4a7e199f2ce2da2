#!/usr/bin/env bash
# Fills the two ignored folders that travel with a GPU run (the device
# machine has no network): .whl/ with the nanobind and scikit-build-core
# wheels for its Python 3.12 (the wheel phase builds without isolation),
# and .deps/ with Debian's simdjson packages unpacked by dpkg -x (the machine
# lacks libsimdjson). scripts/gpu.sh finds both. Call with
# carry ["third_party", ".whl", ".deps"]. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ls .whl/nanobind-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl nanobind==3.1.0
fi
# scikit-build-core and its dependencies, for the `wheel` phase's pip wheel
# without build isolation (pure-Python wheels).
if ! ls .whl/scikit_build_core-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --platform any \
    -d .whl scikit-build-core
fi
if [[ ! -d .deps/usr/lib/x86_64-linux-gnu ]]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -qq libsimdjson-dev libsimdjson14 >/dev/null)
  for f in "$tmp"/*.deb; do dpkg -x "$f" .deps; done
  rm -rf "$tmp"
fi
du -sh .whl .deps
