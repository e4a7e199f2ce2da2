#!/usr/bin/env bash
# Installs everything attnprof needs on a fresh Debian/Ubuntu machine:
# the compiler toolchain, CMake, OpenBLAS, GoogleTest, nlohmann-json,
# simdjson and zlib (the trace reader),
# clang-format (the tests check formatting), Chromium (the HTML report's
# browser test), Plotly.js (from PyPI's plotly wheel, into the ignored
# third_party/plotly/, inlined into every --html report), the Python packages
# the tests run (Pillow; HolisticTraceAnalysis, which reads our traces), the
# Python package's build and test dependencies from PyPI (nanobind,
# scikit-build-core, pytest, numpy, torch: the default torch wheel, which on
# x86-64 Linux brings the NVIDIA runtime wheels, a few GiB) and,
# when a CUDA toolkit is present, the cuDNN frontend headers (from PyPI,
# into the ignored folder third_party/). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need=(g++ cmake ninja-build pkg-config libopenblas-dev libgtest-dev nlohmann-json3-dev libsimdjson-dev zlib1g-dev python3
      python3-dev python3-pip python3-venv clang-format git chromium)
missing=()
for p in "${need[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# cuDNN frontend (header-only C++ API over cuDNN's graph backend). Only a
# CUDA build reads it; it comes from PyPI and lives in an ignored folder.
fe=third_party/cudnn_frontend
if [[ ! -f $fe/include/cudnn_frontend.h ]] && command -v python3 >/dev/null; then
  if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
    echo "setup: fetching cuDNN frontend headers into $fe" >&2
    tmp=$(mktemp -d)
    if python3 -m pip download -q --no-deps -d "$tmp" "nvidia-cudnn-frontend>=1.8" >/dev/null 2>&1; then
      mkdir -p "$fe"
      python3 - "$tmp" "$fe" <<'PY'
import sys, zipfile, tarfile, pathlib, shutil
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for f in src.iterdir():
    if f.suffix == ".whl":
        with zipfile.ZipFile(f) as z:
            for n in z.namelist():
                if ("include/" in n) and n.endswith((".h", ".hpp", ".inl")):
                    rel = n.split("include/", 1)[1]
                    out = dst / "include" / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(z.read(n))
PY
    else
      echo "setup: could not fetch nvidia-cudnn-frontend; the cudnn backend will be left out" >&2
    fi
    rm -rf "$tmp"
  fi
fi

# Plotly.js for the HTML report: the minified bundle inside PyPI's plotly
# wheel (plotly/package_data/plotly.min.js), pinned so reports do not change
# under us. CMake points the attnprof command at this file (and installs it).
plotly_version=7.1.0
pl=third_party/plotly
if [[ ! -f $pl/plotly.min.js || "$(cat $pl/VERSION 2>/dev/null)" != "$plotly_version" ]]; then
  echo "setup: fetching Plotly.js from the plotly $plotly_version wheel into $pl" >&2
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" "plotly==$plotly_version" >/dev/null
  mkdir -p "$pl"
  python3 - "$tmp" "$pl" "$plotly_version" <<'PY'
import sys, zipfile, pathlib
src, dst, version = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
wheel = next(src.glob("plotly-*.whl"))
with zipfile.ZipFile(wheel) as z:
    js = z.read("plotly/package_data/plotly.min.js")
tmp = dst / "plotly.min.js.tmp"
tmp.write_bytes(js)
tmp.replace(dst / "plotly.min.js")
(dst / "VERSION").write_text(version)
PY
  rm -rf "$tmp"
fi

# pip into the python3 on the path (CMake's FindPython and the Python tests use
# the same one). Debian's own python3 refuses installs outside a virtual
# environment (PEP 668) unless told.
pip_install=(python3 -m pip install -q --disable-pip-version-check)
if python3 -c 'import sys, sysconfig, pathlib; sys.exit(not (pathlib.Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED").exists())'; then
  pip_install+=(--break-system-packages)
fi

# Python packages the tests run: Pillow (the browser test reads its
# screenshots) and Holistic Trace Analysis (the HTA test loads our traces).
# HTA is installed without its declared dependencies, which pull in
# JupyterLab; what it imports is listed here instead.
py_deps=(pillow pandas plotly networkx numpy psutil pyyaml)
if ! python3 -c "import PIL, hta, pandas, plotly, networkx, numpy, psutil, yaml" >/dev/null 2>&1; then
  echo "setup: installing Python packages: ${py_deps[*]} HolisticTraceAnalysis" >&2
  "${pip_install[@]}" "${py_deps[@]}"
  "${pip_install[@]}" --no-deps "HolisticTraceAnalysis==0.5.0"
fi

# The Python package: its build backend and binding library, and what its
# tests import (transformers: attnprof.integrations.transformers's test runs
# a tiny random-weight Llama against SDPA, and scripts/record_model_traces.py
# records one; neither downloads anything).
py_need=(nanobind scikit_build_core pytest numpy torch transformers)
py_pkgs=(nanobind scikit-build-core pytest numpy torch transformers)
py_missing=()
for i in "${!py_need[@]}"; do
  python3 -c "import ${py_need[$i]}" >/dev/null 2>&1 || py_missing+=("${py_pkgs[$i]}")
done
if ((${#py_missing[@]})); then
  echo "setup: pip installing ${py_missing[*]}" >&2
  "${pip_install[@]}" "${py_missing[@]}"
fi
echo "setup: ok" >&2
