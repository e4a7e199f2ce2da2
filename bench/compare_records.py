"""One `attnprof compare --json` run's records by backend, for the benchmarks that time flash's choices against
forced ones (gqa_backward.py, decode_rows.py): each run its own process, with the forcing variable set or cleared,
so a choice read once a process is the one asked for."""
import json
import os
import subprocess


def compare_records(attnprof, args, path, env_var=None, value=None, timeout_s=240):
    """Runs `attnprof compare ARGS --json PATH --quiet` with env_var set to value (cleared when value is falsy);
    returns {backend: record}, or {"error": the output's last line} when no JSON was written."""
    if os.path.exists(path):
        os.remove(path)
    env = dict(os.environ)
    if env_var:
        env.pop(env_var, None)
        if value:
            env[env_var] = str(value)
    proc = subprocess.run([attnprof, "compare", *args, "--json", path, "--quiet"], capture_output=True, text=True,
                          env=env, timeout=timeout_s)
    if not os.path.exists(path):
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {proc.returncode}"}
    with open(path) as f:
        return {r["backend"]: r for r in json.load(f)["results"]}
