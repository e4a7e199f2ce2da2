"""The module loads the GPU stack only when a GPU is asked for (the CUDA half
is a plugin, libattnprof_cuda.so, loaded on first use). Each case runs in a
fresh interpreter so that no other test's CUDA use is in its process."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import attnprof

CUDA_LIBRARIES = ("libcudart", "libcublas", "libcudnn", "libcupti", "libnvrtc", "libcuda.so", "libnccl")


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True, text=True,
                          timeout=300)


SMALL = "batch=1, heads=2, seq=128, head_dim=64, trace_dir=None"


def test_a_cpu_run_maps_no_cuda_library():
    r = run_python(f"""
        import attnprof
        rep = attnprof.compare(device="cpu", {SMALL})
        maps = open("/proc/self/maps").read()
        print("\\n".join(sorted({{l.split()[-1] for l in maps.splitlines() if "/lib" in l}})))
    """)
    assert r.returncode == 0, r.stderr
    mapped = [line for line in r.stdout.splitlines() if any(name in line for name in CUDA_LIBRARIES)]
    assert not mapped, f"a CPU compare mapped {mapped}"


def has_gpu() -> bool:
    return Path("/dev/nvidia0").exists()


@pytest.mark.skipif(attnprof.cuda_built() and has_gpu(), reason="this machine has a GPU: device='cuda' runs")
def test_cuda_without_a_usable_gpu_is_one_error():
    r = run_python(f"""
        import attnprof
        try:
            attnprof.compare(device="cuda", {SMALL})
        except attnprof.Error as e:
            print("refused:", e)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused:") and "CUDA" in r.stdout, r.stdout


STUB = os.environ.get("ATTNPROF_CUDA_STUB_DRIVER")


@pytest.mark.skipif(not attnprof.cuda_built() or not STUB,
                    reason="a CUDA build, and the toolkit's stub driver (ATTNPROF_CUDA_STUB_DRIVER, set by CTest)")
def test_the_plugin_loads_into_the_module_against_the_stub_driver(tmp_path):
    # The stub stands in for libcuda.so.1: the plugin and every CUDA library
    # load (every symbol the plugin takes from the module resolved), and the
    # CUDA runtime itself answers that there is no device.
    (tmp_path / "libcuda.so.1").symlink_to(STUB)
    r = run_python(f"""
        import attnprof
        try:
            attnprof.compare(device="cuda", {SMALL})
        except attnprof.Error as e:
            print("refused:", e)
    """, env={"LD_LIBRARY_PATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "no CUDA device" in r.stdout, r.stdout
