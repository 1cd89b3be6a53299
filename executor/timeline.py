"""The run's timeline as a Chrome / Perfetto trace (the JSON trace-event format).

Every run writes ``trace.json`` beside its ``profile.json``: open it in https://ui.perfetto.dev
(or ``chrome://tracing``) to see, on one time axis,

* each input worker's batch production (``produce``) and the batch's transfer to the wafer's
  side (``transfer``: from the end of production until the batch reached the wafer driver's
  input feed, waiting in the worker's buffer included), one track per worker;
* the wafer's steps (``compute``), its waits for input (``input wait``) and its input-buffer
  occupancy (a counter);
* in an autoscaled run, each worker's life (``alive``: from its first batch's production to
  its last, around them on its track), each CS-X's worker count (a counter) and every
  decision of the controller (an instant event with its reason);
* the client's steps, its step and checkpoint closures, and the start-up phases.

Events are complete events (``"ph": "X"``, ``ts``/``dur`` in microseconds from the run's first
event), counters (``"C"``) and process/thread names (``"M"``).

>>> profile = {"steps": [{"step": 1, "samples": 4, "compute_s": 0.01, "input_wait_s": 0.002,
...     "end_unix": 100.02, "workers": [0], "produce_start_unix": [99.99],
...     "produce_end_unix": [100.0], "received_unix": [100.001]}]}
>>> trace = build_trace(profile)
>>> sorted({e["name"] for e in trace["traceEvents"] if e["ph"] == "X"})
['compute', 'input wait', 'produce', 'transfer']
>>> [round(e["dur"]) for e in trace["traceEvents"] if e["name"] == "produce"]
[10000]
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CLIENT_PID, WAFER_PID, WORKERS_PID = 1, 2, 10
"""Process ids of the tracks: the client, the wafer, and CS-X ``c``'s input workers at
``WORKERS_PID + c``."""


def _spans(profile: dict):
    """(pid, tid, name, start_unix, end_unix, args) of every span the profile records."""
    for p in profile.get("phases", []):
        yield CLIENT_PID, 0, p["name"], p["start_unix"], p["end_unix"], {}
    for r in profile.get("steps", []):
        step = r["step"]
        if "client_start_unix" in r and "client_end_unix" in r:
            yield (CLIENT_PID, 1, f"step {step}", r["client_start_unix"], r["client_end_unix"],
                   {"step": step})
        if "end_unix" in r and "compute_s" in r:
            end, compute, wait = r["end_unix"], r["compute_s"], r.get("input_wait_s", 0.0)
            yield WAFER_PID, 1, "input wait", end - compute - wait, end - compute, {"step": step}
            yield (WAFER_PID, 1, "compute", end - compute, end,
                   {"step": step, "samples": r.get("samples")})
        starts, ends = r.get("produce_start_unix"), r.get("produce_end_unix")
        received = r.get("received_unix")
        workers = r.get("workers") or []
        if starts and ends:
            for c, w in enumerate(workers):
                args = {"step": step, "csx": c, "worker": int(w)}
                yield WORKERS_PID + c, 2 * int(w), "produce", starts[c], ends[c], args
                if received:
                    yield WORKERS_PID + c, 2 * int(w) + 1, "transfer", ends[c], received[c], args
    for s in profile.get("client_spans", []):
        yield (CLIENT_PID, 2, s["name"], s["start_unix"], s["end_unix"],
               {"step": s.get("step"), "kind": s.get("kind")})


def _worker_lives(profile: dict):
    """An autoscaled run's spans of each worker's life, from the first batch it produced to
    the end of its last (a worker's track holds only its own batches, inside the span)."""
    if not (profile.get("summary") or {}).get("autoscale"):
        return
    lives: dict = {}
    for r in profile.get("steps", []):
        starts, ends = r.get("produce_start_unix"), r.get("produce_end_unix")
        if not (starts and ends):
            continue
        for c, w in enumerate(r.get("workers") or []):
            first, last = lives.get((c, int(w)), (starts[c], ends[c]))
            lives[(c, int(w))] = (min(first, starts[c]), max(last, ends[c]))
    for (c, w), (first, last) in sorted(lives.items()):
        yield WORKERS_PID + c, 2 * w, "alive", first, last, {"csx": c, "worker": w}


def _autoscale_events(profile: dict, t0: float) -> list[dict]:
    """The worker-count counters and the controller's decisions of an autoscaled run."""
    autoscale = (profile.get("summary") or {}).get("autoscale")
    if not autoscale:
        return []
    events = []
    for r in profile.get("steps", []):
        if "end_unix" in r and r.get("num_workers"):
            events.append({"name": "input workers", "ph": "C", "pid": WAFER_PID, "tid": 1,
                           "ts": (r["end_unix"] - t0) * 1e6,
                           "args": {f"CS-X {c}": n for c, n in enumerate(r["num_workers"])}})
    for d in autoscale.get("decisions", []):
        what = f"add {d['count']}" if d["action"] == "add" else \
            f"retire {', '.join(map(str, d['workers']))}"
        events.append({"name": f"autoscale CS-X {d['csx']}: {what}", "ph": "i", "s": "p",
                       "pid": WAFER_PID, "tid": 1, "ts": (d["decided_unix"] - t0) * 1e6,
                       "args": {"step": d["step"], "reason": d["reason"]}})
    return events


def _names(profile: dict, pids: set, tids: set) -> list[dict]:
    meta = []

    def name(pid, tid, text, sort):
        if tid is None:
            meta.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": text}})
            meta.append({"ph": "M", "pid": pid, "name": "process_sort_index",
                         "args": {"sort_index": sort}})
        else:
            meta.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                         "args": {"name": text}})
            meta.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                         "args": {"sort_index": sort}})

    for pid in sorted(pids):
        if pid == CLIENT_PID:
            name(pid, None, "client (the training script)", 0)
        elif pid == WAFER_PID:
            name(pid, None, "wafer (driver)", 1)
        else:
            name(pid, None, f"input workers, CS-X {pid - WORKERS_PID}", pid)
    for pid, tid in sorted(tids):
        if pid == CLIENT_PID:
            name(pid, tid, ("start-up", "steps", "closures")[tid], tid)
        elif pid == WAFER_PID:
            name(pid, tid, "steps", tid)
        else:
            what = "produce" if tid % 2 == 0 else "transfer"
            name(pid, tid, f"worker {tid // 2}: {what}", tid)
    return meta


def build_trace(profile: dict) -> dict:
    """The trace-event document of a ``profile.json`` document (see the module docstring)."""
    spans = [s for s in (*_spans(profile), *_worker_lives(profile)) if s[4] >= s[3]]
    t0 = min((s[3] for s in spans), default=0.0)
    events = []
    for pid, tid, name, start, end, args in spans:
        events.append({"name": name, "cat": "cstream", "ph": "X", "pid": pid, "tid": tid,
                       "ts": (start - t0) * 1e6, "dur": (end - start) * 1e6,
                       "args": {k: v for k, v in args.items() if v is not None}})
    for r in profile.get("steps", []):
        if "end_unix" in r and "buffer_occupancy" in r:
            start = r["end_unix"] - r["compute_s"] - r.get("input_wait_s", 0.0)
            events.append({"name": "input buffer", "ph": "C", "pid": WAFER_PID, "tid": 1,
                           "ts": (start - t0) * 1e6,
                           "args": {"batches ready": r["buffer_occupancy"]}})
    events += _autoscale_events(profile, t0)
    pids = {e["pid"] for e in events}
    tids = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    events.sort(key=lambda e: e["ts"])
    return {"traceEvents": _names(profile, pids, tids) + events, "displayTimeUnit": "ms",
            "otherData": {"t0_unix": t0, "steps": len(profile.get("steps", [])),
                          "name": profile.get("name"),
                          "interrupted": profile.get("interrupted")}}


def write_trace(path, profile: dict) -> Path:
    """Write :func:`build_trace` of ``profile`` to ``path`` (atomically)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(build_trace(profile), default=float))
    os.replace(tmp, path)
    return path
