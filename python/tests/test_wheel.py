"""`pip wheel .` builds a wheel (CPU only, to keep CI's time) that installs into a fresh
virtual environment, where `import attnprof`, the README's example and the attnprof
console script work. Slow (a whole build): marked `slow`, run by its own CTest test."""

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    # The README's Python example, as the README shows it.
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n", text.index("## In Python")) + len("```python\n")
    return text[start:text.index("```", start)]


@pytest.mark.slow
def test_wheel_installs_and_runs_in_a_fresh_venv(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing from the build tree
    wheels = tmp_path / "wheels"
    cmd = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-w", str(wheels),
           "-C", "cmake.define.ATTNPROF_CUDA=OFF"]
    if os.environ.get("ATTNPROF_WHEEL_BUILD_DIR"):  # reused between runs: an incremental build
        cmd += ["-C", f"build-dir={os.environ['ATTNPROF_WHEEL_BUILD_DIR']}"]
    subprocess.run(cmd, check=True, env=env)
    (wheel,) = wheels.glob("attnprof-*.whl")

    venv.create(tmp_path / "venv", with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    py = str(bin_dir / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, env=env)
    subprocess.run([py, "-c", "import attnprof, sys; assert 'torch' not in sys.modules; "
                    "print(attnprof.__file__, attnprof.backend_names())"], check=True, env=env, cwd=tmp_path)
    help_text = subprocess.run([str(bin_dir / "attnprof"), "--help"], check=True, env=env, capture_output=True,
                               text=True).stdout
    assert "compare" in help_text
    # The README's example needs numpy, the wheel's one dependency.
    subprocess.run([py, "-m", "pip", "install", "-q", "numpy"], check=True, env=env)
    subprocess.run([py, "-c", readme_example()], check=True, env=env, cwd=tmp_path)
