"""The tables bench_vs_torch.py prints and writes: every backend's row
against PyTorch's counterpart (detail_table), and the summary of our flash
against our cudnn and PyTorch's SDPA with each target judged (summarize,
summary_table: issue 12's forward targets, or on a backward run issue 21's
flash <= 1.00x cudnn per row and the count of rows that meet it), with what
the profiler's rules said of our flash (findings_list). Plain formatting: no
torch, no timing."""

import os

# Issue 12's targets (forward); issue 21's backward one is the same ratio.
TARGET_FLASH_OVER_CUDNN = 1.00
TARGET_TFLOPS, TARGET_TFLOPS_ROW = 700.0, (2, 16, 16, 8192, 8192, 128, "none", "contiguous", 0, "bf16")
TARGET_COPY_PCT = 80.0
TARGET_HOST_US = 5.0


def first_line(text, limit=200):
    line = next((x.strip() for x in str(text).splitlines() if x.strip()), "")
    line = line.split(" (Triggered internally at")[0]  # where in ATen a warning was raised
    return line if len(line) <= limit else line[: limit - 3] + "..."


def run_compare(cmd, path, backends, timeout=300):
    """One `attnprof compare ... --json path` process: its results by backend, or each backend's
    {"reason": the process's last line} when it gave no JSON (exit 3 is a run with a failed check)."""
    import json
    import subprocess
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode not in (0, 3) or not os.path.exists(path):
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        why = tail[-1] if tail else f"exit {proc.returncode}"
        return {b: {"reason": why} for b in backends}
    with open(path) as f:
        return {r["backend"]: r for r in json.load(f)["results"]}


def did_not_run(m):
    """Our record's reason when that backend gave no GPU time, else None."""
    if m.get("device_time_us"):
        return None
    if not m:
        return "no record in attnprof's JSON"
    return first_line(m.get("reason") or "ran, but no device time was recorded")


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def ms(us):
    return None if us is None else us / 1e3


def shape_cell(r):
    """The shape, and the dtype where it is not bf16 (records written before rows had one were bf16)."""
    dtype = r.get("dtype") or "bf16"
    return r["shape"] + ("" if dtype == "bf16" else f" {dtype}")


def host_cell(r):
    """Our median host us per call, with the p10-p90 spread of the calls."""
    if r["ours_host_us"] is None or r["ours_host_p10_us"] is None or r["ours_host_p90_us"] is None:
        return fmt(r["ours_host_us"], ".1f")
    return f'{r["ours_host_us"]:.1f} ({r["ours_host_p10_us"]:.1f}-{r["ours_host_p90_us"]:.1f})'


def summarize(row, mine, torch_runs, fl, ceiling, pass_="forward"):
    """One summary line: our flash and cudnn, PyTorch's SDPA, the ratios, and
    the targets for this row (issue 12's forward ones; issue 21's on a backward
    pass)."""
    fla, cud = mine.get("flash", {}), mine.get("cudnn", {})
    f_us, c_us = fla.get("device_time_us"), cud.get("device_time_us")
    sdpa = {n: t for n, t in torch_runs.items() if n.startswith("sdpa") and t.get("gpu_us")}
    best = min(sdpa, key=lambda n: sdpa[n]["gpu_us"]) if sdpa else None
    t_best = sdpa[best]["gpu_us"] if best else None
    s = {
        "class": row.cls, "shape": row.shape(), "batch": row.b, "heads": row.h, "kv_heads": row.hkv, "seq": row.sq,
        "kv_seq": row.skv, "head_dim": row.d, "mask": row.mask, "kv_cache": row.kv_cache,
        "page_size": row.page_size or None, "dtype": row.dtype, "pass": pass_, "flops": fl,
        "kv_bytes": row.kv_bytes(),
        "torch_cache": "contiguous (PyTorch has no paged SDPA)" if row.paged else "contiguous",
        "flash_us": f_us, "cudnn_us": c_us, "flash_reason": did_not_run(fla), "cudnn_reason": did_not_run(cud),
        # Refused: attnprof said the backend cannot take the problem (as
        # against one that failed or left no record).
        "flash_refused": fla.get("eligible") is False and not fla.get("failed"),
        "cudnn_refused": cud.get("eligible") is False and not cud.get("failed"),
        "flash_accepted": fla.get("accepted"), "cudnn_accepted": cud.get("accepted"),
        "flash_rel_error": fla.get("rel_error"), "flash_host_us": fla.get("host_time_unprofiled_us"),
        "torch": {n: {k: t.get(k) for k in ("gpu_us", "host_us", "kind", "reason")} for n, t in torch_runs.items()
                  if n.startswith("sdpa")},
        "torch_default_us": torch_runs.get("sdpa", {}).get("gpu_us"),
        "torch_default_kind": torch_runs.get("sdpa", {}).get("kind"),
        "torch_cudnn_us": torch_runs.get("sdpa_cudnn", {}).get("gpu_us"),
        "torch_best_us": t_best, "torch_best": best,
        "flash_over_cudnn": f_us / c_us if f_us and c_us else None,
        "flash_over_torch": f_us / t_best if f_us and t_best else None,
        "flash_tflops": fl / f_us / 1e6 if f_us else None,
        "cudnn_tflops": fl / c_us / 1e6 if c_us else None,
        "torch_best_tflops": fl / t_best / 1e6 if t_best else None,
        "copy_ceiling_bytes_per_s": ceiling,
        # attnprof's own memory figures where the binary writes them: its
        # minimum bytes per call (Q, K, V, O, a block table) over the time,
        # against the copy ceiling it measured; a cross-check of ours.
        "flash_attnprof_gbs": fla.get("gbs"), "flash_attnprof_copy_pct": fla.get("copy_ceiling_pct"),
        "attnprof_copy_ceiling_gbs": fla.get("copy_ceiling_gbs") or cud.get("copy_ceiling_gbs"),
    }
    if row.cls == "decode":
        for who, us in (("flash", f_us), ("cudnn", c_us), ("torch_best", t_best)):
            bw = row.kv_bytes() / (us * 1e-6) if us else None
            s[f"{who}_kv_bytes_per_s"] = bw
            s[f"{who}_kv_pct_copy"] = 100.0 * bw / ceiling if bw and ceiling else None
    if pass_ == "backward":
        s["backward_target"], s["target"] = backward_target(s)
        s["misses"] = [s["target"].removeprefix("missed: ")] if s["backward_target"] == "missed" else []
        s["unknown"] = [s["target"].removeprefix("no figure: ")] if s["backward_target"] == "no figure" else []
        return s
    s["misses"], s["unknown"] = targets(row, s)
    s["target"] = verdict(s["misses"], s["unknown"])
    return s


def backward_target(s):
    """Issue 21's target on a backward row, flash <= 1.00x our cudnn: ("met" |
    "missed" | "no figure", the line that says so, with the ratio or with the
    one-line reason the backend that did not run gave)."""
    for who in ("flash", "cudnn"):
        if not s[f"{who}_us"]:  # no time, or none recorded
            did = "refused the row" if s[f"{who}_refused"] else "did not run"
            return "no figure", f"no figure: our {who} {did}: {s[f'{who}_reason']}"
    ratio = s["flash_over_cudnn"]
    text = f"flash {ratio:.2f}x cudnn"
    if s["cudnn_accepted"] is False:
        text += " (cudnn over its error tolerance)"
    if s["flash_accepted"] is False:
        return "missed", f"missed: {text}, flash over its error tolerance"
    if round(ratio, 2) > TARGET_FLASH_OVER_CUDNN:
        return "missed", f"missed: {text}"
    return "met", f"met: {text}"


def targets(row, s):
    """Issue 12's targets that apply to the row: those missed, those that cannot be judged."""
    misses, unknown = [], []
    if s["flash_us"] is None:
        return ["flash did not run"], []
    if s["flash_accepted"] is False:
        misses.append("flash over its error tolerance")
    if s["flash_over_cudnn"] is None:
        unknown.append("cudnn did not run")
    elif round(s["flash_over_cudnn"], 2) > TARGET_FLASH_OVER_CUDNN:
        misses.append(f"flash {s['flash_over_cudnn']:.2f}x cudnn")
    if row.same_problem() == TARGET_TFLOPS_ROW and s["flash_tflops"] < TARGET_TFLOPS:
        misses.append(f"{s['flash_tflops']:.0f} < {TARGET_TFLOPS:.0f} TFLOP/s")
    if row.cls == "decode":
        pct = s.get("flash_kv_pct_copy")
        if pct is None:
            unknown.append("no copy ceiling")
        elif pct < TARGET_COPY_PCT:
            misses.append(f"{pct:.0f}% < {TARGET_COPY_PCT:.0f}% of copy")
    if s["flash_host_us"] is not None and s["flash_host_us"] > TARGET_HOST_US:
        misses.append(f"host {s['flash_host_us']:.1f} > {TARGET_HOST_US:.0f} us")
    return misses, unknown


def verdict(misses, unknown):
    """yes, no (what missed), or ? (what could not be judged: a comparison backend that did not run)."""
    if misses:
        return "no: " + "; ".join(misses) + (f" (? {'; '.join(unknown)})" if unknown else "")
    return "? " + "; ".join(unknown) if unknown else "yes"


def kv_cell(s, who):
    bw, pct = s.get(f"{who}_kv_bytes_per_s"), s.get(f"{who}_kv_pct_copy")
    if bw is None:
        return "-"
    return f"{bw / 1e12:.2f} ({pct:.0f}%)" if pct is not None else f"{bw / 1e12:.2f}"


def best_note(s):
    """Which PyTorch backend was fastest: forced by name, or its own dispatch (and what that picked)."""
    if not s["torch_best"]:
        return ""
    if s["torch_best"] == "sdpa":
        return f" (default: {s['torch_default_kind']})" if s["torch_default_kind"] else " (default)"
    return f" ({s['torch_best'].removeprefix('sdpa_')})"


def time_cell(us, reason):
    return "refused" if us is None and reason else fmt(ms(us), ".3f")


def did_not_run_notes(summary):
    """One line per backend of a summary row that did not run, and why (a
    PyTorch run that paged rows share is told once)."""
    notes, told = [], set()
    for i, s in enumerate(summary, 1):
        where = f"row {i} ({s['class']} {shape_cell(s)} {s['mask']}, {s['kv_cache']}" + (
            f" {s['page_size']})" if s["page_size"] else ")")
        for who in ("flash", "cudnn"):
            if s[f"{who}_reason"]:
                notes.append(f"- {where}: our {who}: {s[f'{who}_reason']}")
        for name, t in s["torch"].items():
            key = (s["shape"], s.get("dtype"), s["mask"], name)
            if t.get("reason") and key not in told:  # paged rows share the contiguous runs
                told.add(key)
                notes.append(f"- {where}: torch {name}: {t['reason']}")
    return notes


def torch_default_cell(s):
    """PyTorch's SDPA as it dispatches by itself, and which backend that picked."""
    default = s["torch"].get("sdpa", {})
    cell = time_cell(default.get("gpu_us"), default.get("reason"))
    if default.get("gpu_us") and s["torch_default_kind"]:
        cell += f" ({s['torch_default_kind']})"
    return cell


def torch_cell(s, name):
    t = s["torch"].get(name, {})
    return time_cell(t.get("gpu_us"), t.get("reason"))


def backward_tally(summary):
    """The last line of a backward summary: how many rows meet issue 21's target."""
    by = {v: [s for s in summary if s.get("backward_target") == v] for v in ("met", "missed", "no figure")}
    line = (f"Backward target flash <= {TARGET_FLASH_OVER_CUDNN:.2f}x cudnn: met on {len(by['met'])} of "
            f"{len(summary)} rows, missed on {len(by['missed'])}, no figure on {len(by['no figure'])}")
    rest = [v + " " + ", ".join(f"{s['class']} {shape_cell(s)} {s['mask']}" for s in by[v])
            for v in ("missed", "no figure") if by[v]]
    return line + (f" ({'; '.join(rest)})" if rest else "") + "."


def backward_summary_table(summary):
    """A backward run's summary: issue 21's target judged on every row, then
    the backends that did not run, then the count of rows that meet it."""
    lines = ["| class | B x H(/Hkv) x S(/Skv) x D | mask | our flash ms | our cudnn ms | torch SDPA ms (picks) "
             "| torch flash SDPA ms | torch cuDNN SDPA ms | torch best ms | flash/cudnn | flash/torch best "
             "| flash TFLOP/s | cudnn TFLOP/s | flash host us | flash <= 1.00x cudnn? |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append("| " + " | ".join([
            s["class"], shape_cell(s), s["mask"], time_cell(s["flash_us"], s["flash_reason"]),
            time_cell(s["cudnn_us"], s["cudnn_reason"]), torch_default_cell(s), torch_cell(s, "sdpa_flash"),
            torch_cell(s, "sdpa_cudnn"), fmt(ms(s["torch_best_us"]), ".3f") + best_note(s),
            fmt(s["flash_over_cudnn"], ".2f"), fmt(s["flash_over_torch"], ".2f"), fmt(s["flash_tflops"], ".0f"),
            fmt(s["cudnn_tflops"], ".0f"), fmt(s["flash_host_us"], ".1f"), s["target"]]) + " |")
    head = [
        "Summary (backward): GPU time per backward call (kernel time); ratios below 1 mean our flash is faster. "
        "torch SDPA: PyTorch's dispatch left to itself (the kernels it ran say which backend); torch best: the "
        "fastest of its SDPA backends on this row. Every row is bf16 unless its shape says fp16.",
        "TFLOP/s: backward FLOPs, 2.5x the forward's 4 * B * H * D * (query-key pairs the mask keeps).",
        f"Target (issue 21): our flash's backward <= {TARGET_FLASH_OVER_CUDNN:.2f}x our cudnn's on every row, the "
        "ratio rounded to 2 places; no figure where either did not run (the reason is on the row).",
    ]
    body = "\n".join(head) + "\n\n" + "\n".join(lines)
    notes = did_not_run_notes(summary)
    if notes:
        body += "\n\nDid not run:\n" + "\n".join(notes)
    return body + "\n\n" + backward_tally(summary)


def summary_table(summary, ceiling, pass_):
    """The final table, and one line per backend that did not run and why."""
    if pass_ == "backward":
        return backward_summary_table(summary)
    lines = ["| class | B x H(/Hkv) x S(/Skv) x D | mask | KV cache | our flash ms | our cudnn ms | torch SDPA ms (picks) "
             "| torch cuDNN SDPA ms | torch best ms | flash/cudnn | flash/torch best | flash TFLOP/s | cudnn TFLOP/s "
             "| flash KV TB/s (% copy) | cudnn KV TB/s (% copy) | flash host us | target met? |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        cache = s["kv_cache"] if not s["page_size"] else f"paged {s['page_size']} (torch: contiguous)"
        lines.append("| " + " | ".join([
            s["class"], shape_cell(s), s["mask"], cache, time_cell(s["flash_us"], s["flash_reason"]),
            time_cell(s["cudnn_us"], s["cudnn_reason"]), torch_default_cell(s), torch_cell(s, "sdpa_cudnn"),
            fmt(ms(s["torch_best_us"]), ".3f") + best_note(s),
            fmt(s["flash_over_cudnn"], ".2f"), fmt(s["flash_over_torch"], ".2f"), fmt(s["flash_tflops"], ".0f"),
            fmt(s["cudnn_tflops"], ".0f"), kv_cell(s, "flash"), kv_cell(s, "cudnn"), fmt(s["flash_host_us"], ".1f"),
            s["target"]]) + " |")
    notes = did_not_run_notes(summary)
    head = [
        f"Summary ({pass_}): GPU time per call (kernel time); ratios below 1 mean our flash is faster. torch SDPA: "
        "PyTorch's dispatch left to itself (the kernels it ran say which backend); torch best: the fastest of its "
        "SDPA backends on this row.",
        f"Copy ceiling: {ceiling['bytes_per_s'] / 1e12:.2f} TB/s (bytes read + written by a "
        f"{ceiling['copied_bytes'] / 2**30:g} GiB copy_ on the {ceiling['device']}, best of {ceiling['reps']}); decode rows: K/V "
        "bytes (Hkv * Skv * D * 2 tensors * 2 bytes * batch) per second of GPU time, and their % of that ceiling (a "
        "kernel that only reads can pass 100%).",
        f"Targets: flash <= {TARGET_FLASH_OVER_CUDNN:.2f}x cudnn on every row; >= {TARGET_TFLOPS:.0f} TFLOP/s at "
        f"2x16x8192x128 non-causal; decode >= {TARGET_COPY_PCT:.0f}% of the copy ceiling; flash host <= "
        f"{TARGET_HOST_US:.0f} us per call.",
    ]
    if any(s["page_size"] for s in summary):
        head.append("PyTorch has no paged SDPA: on paged rows its columns are its times on the contiguous cache.")
    body = "\n".join(head) + "\n\n" + "\n".join(lines)
    if notes:
        body += "\n\nDid not run:\n" + "\n".join(notes)
    return body


# The findings each row keeps (attnprof's rule ids): memory- or compute-bound
# against the measured ceilings, and the split-KV decode's splits and combine.
FINDINGS_KEPT = ("bound", "split-kv")


def findings_list(results):
    """Our flash's kept findings, one line each, under the summary table."""
    lines = [f"- {r['class']} {shape_cell(r)} {r['mask']} {r['kv_cache']}"
             f"{' ' + str(r['page_size']) if r.get('page_size') else ''}, {r['backend']}: {text}"
             for r in results if r["backend"] == "flash"
             for text in (r.get("ours_findings") or {}).values()]
    return "\n\nWhat the profiler said of our flash (rules bound, split-kv):\n" + "\n".join(lines) if lines else ""


def detail_table(results):
    # Host us: no profiler attached (the cost a program pays; ours with the
    # p10-p90 spread of its calls in parentheses); "profiled": the
    # same calls under CUPTI's API tracing (ours) or torch.profiler (PyTorch's).
    lines = ["| shape | mask | backend | ours ms | torch ms | ours/torch | ours TFLOP/s | torch TFLOP/s "
             "| ours host us | torch host us | ours host us, profiled | torch host us, profiled | ours kernels | ours rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            shape_cell(r) + (f" paged {r['page_size']}" if r["page_size"] else ""), r["mask"], r["backend"],
            fmt(ms(r["ours_gpu_us"]), ".3f"), fmt(ms(r["torch_gpu_us"]), ".3f"),
            fmt(r["ratio"], ".2f"), fmt(r["ours_tflops"], ".0f"), fmt(r["torch_tflops"], ".0f"),
            host_cell(r), fmt(r["torch_host_us"], ".1f"),
            fmt(r["ours_host_profiled_us"], ".1f"), fmt(r["torch_host_profiled_us"], ".1f"),
            fmt(r["ours_kernels"], ".0f"), fmt(r["ours_rel_error"], ".1e")))
    notes = [f"- {shape_cell(r)} {r['mask']}{' paged ' + str(r['page_size']) if r['page_size'] else ''}: "
             f"{who}: {why}"
             for r in results for who, why in ((f"our {r['backend']}", r["ours_reason"]),
                                               (f"torch {r['torch']}", r["torch_reason"])) if why]
    return "\n".join(lines) + ("\n\nDid not run:\n" + "\n".join(notes) if notes else "")
