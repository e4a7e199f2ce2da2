#!/usr/bin/env bash
# Installs everything attnprof needs on a fresh Debian/Ubuntu machine:
# the compiler toolchain, CMake, OpenBLAS, GoogleTest, nlohmann-json,
# clang-format (the tests check formatting), the Python package's build and
# test dependencies from PyPI (nanobind, scikit-build-core, pytest, numpy,
# torch: the default torch wheel, which on x86-64 Linux brings the NVIDIA
# runtime wheels, a few GiB) and,
# when a CUDA toolkit is present, the cuDNN frontend headers (from PyPI,
# into the ignored folder third_party/). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need=(g++ cmake ninja-build pkg-config libopenblas-dev libgtest-dev nlohmann-json3-dev python3 python3-dev python3-pip python3-venv clang-format git)
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
# The Python package: its build backend and binding library, and what its tests
# import. Installed into the python3 on the path (CMake's FindPython and the
# pytest CTest test use the same one).
py_need=(nanobind scikit_build_core pytest numpy torch)
py_pkgs=(nanobind scikit-build-core pytest numpy torch)
py_missing=()
for i in "${!py_need[@]}"; do
  python3 -c "import ${py_need[$i]}" >/dev/null 2>&1 || py_missing+=("${py_pkgs[$i]}")
done
if ((${#py_missing[@]})); then
  echo "setup: pip installing ${py_missing[*]}" >&2
  pip_flags=(-q)
  # A distribution's own python3 refuses pip installs (PEP 668) unless told.
  if [[ -f $(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED ]]; then
    pip_flags+=(--break-system-packages)
  fi
  python3 -m pip install "${pip_flags[@]}" "${py_missing[@]}"
fi
echo "setup: ok" >&2
