"""The tests import the attnprof package from PYTHONPATH (the CMake build tree's
<build>/python under CTest, or an installed wheel). A missing module is an
error, never a skip: CI must not pass without the Python package."""

import numpy as np
import pytest

try:
    import attnprof  # noqa: F401
    from attnprof import _core  # noqa: F401
except ImportError as e:  # pragma: no cover - the failure is the message
    raise ImportError(
        f"attnprof's Python module is not importable ({e}): run scripts/setup.sh (it pip installs nanobind), "
        "reconfigure, build, and put <build>/python on PYTHONPATH (ctest does)") from e


def reference(q, k, v, mask="causal", scale=None, window=None):
    """softmax(scale q k^T + mask) v in float64 with numpy, [B, H, S, D] arrays (grouped heads repeated)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s, skv = q.shape[2], k.shape[2]
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    scores = scale * q @ np.swapaxes(k, -1, -2)
    i, j = np.arange(s)[:, None], np.arange(skv)[None, :]
    if mask == "causal":
        scores = np.where(j <= i, scores, -np.inf)
    elif mask == "sliding_window":
        off = skv - s
        scores = np.where((j <= i + off) & (j > i + off - window), scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


@pytest.fixture
def rng():
    return np.random.default_rng(0x5EED)
