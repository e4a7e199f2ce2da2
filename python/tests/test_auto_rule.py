"""auto picks by a rule, not a timing (issue 57 item 7): the same problem in two fresh processes runs on the same
backend, for the same stated reason, with the same bits; explain names the rule."""
import json
import os
import subprocess
import sys

import attnprof

_CHILD = r"""
import hashlib, json, sys
import numpy as np
import attnprof
ex = attnprof.explain(batch=1, heads=1, seq=16, head_dim=8, mask="none", device="cpu", threads=1)
rng = np.random.default_rng(7)
q, k, v = (rng.standard_normal((1, 2, 16, 8), dtype=np.float32) for _ in range(3))
out = attnprof.attention(q, k, v, backend="auto", mask="none", threads=1)
print(json.dumps({"backend": ex.auto.backend, "reason": ex.auto.reason,
                  "bits": hashlib.sha256(np.ascontiguousarray(out).tobytes()).hexdigest()}))
"""


def _fresh_process():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_two_fresh_processes_pick_the_same_backend_for_the_same_reason():
    a, b = _fresh_process(), _fresh_process()
    assert a == b
    assert a["backend"] == "flash"
    assert "auto's rule for cpu: the first eligible of flash > math > naive_inplace > naive" in a["reason"]


def test_explain_names_the_rule():
    ex = attnprof.explain(batch=1, heads=2, seq=64, head_dim=32, device="cpu")
    assert ex.auto.backend == attnprof.explain(batch=1, heads=2, seq=64, head_dim=32, device="cpu").auto.backend
    assert "auto's rule" in ex.auto.reason and "not a timing" in ex.auto.reason
    assert "auto's rule" in repr(ex)
