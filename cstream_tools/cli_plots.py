"""The pictures of ``cstream report`` and ``cstream sweep``: every axis anchored at 0, every
share of the wafer's time drawn (compute, input-starved, client-bound: they add to 100%), the
experiment's name in each title."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

SHARE_COLOURS = {"compute": "#2ca02c", "input-starved": "#d62728", "client-bound": "#7f7f7f"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def step_shares(rows: list[dict]) -> dict[str, list[float]]:
    """Per step (rows from :func:`executor.report.step_rows` with wafer figures): the shares of
    its wall time spent computing, waiting for input, and held back by the client (the rest).
    Each step's three shares add to 1."""
    out = {"compute": [], "input-starved": [], "client-bound": []}
    for r in rows:
        wall = r["step_wall_s"]
        compute = min(r["compute_s"] / wall, 1.0) if wall > 0 else 1.0
        wait = min(r.get("input_wait_s", 0.0) / wall, 1.0 - compute) if wall > 0 else 0.0
        out["compute"].append(compute)
        out["input-starved"].append(wait)
        out["client-bound"].append(max(0.0, 1.0 - compute - wait))
    return out


def windowed_rate(rows: list[dict], window: int = 10) -> list[float]:
    """samples/s over the last ``window`` steps on the wafer's clock (as TensorBoard's
    ``rate``)."""
    rates = []
    ends = [r["wafer_t"] - r["step_wall_s"] for r in rows[:1]] + [r["wafer_t"] for r in rows]
    for k in range(len(rows)):
        lo = max(0, k + 1 - window)
        span = ends[k + 1] - ends[lo]
        rates.append(sum(int(r.get("samples", 0)) for r in rows[lo:k + 1]) / span
                     if span > 0 else 0.0)
    return rates


def plot_run(profile: dict, report: dict, path: Path, title: str) -> Path:
    """report.png: per step, the shares of the wafer's time (stacked to 100%), samples/s and
    the input-buffer occupancy; a run without a wafer (CPU) gets samples/s on the client's
    clock."""
    from executor.report import has_wafer_figures, step_rows

    plt = _pyplot()
    rows = [r for r in step_rows(profile.get("steps", [])) if has_wafer_figures(r)]
    stopped = report.get("interrupted")
    if stopped:
        title += f" (interrupted after {stopped['steps_run']} of {stopped['num_steps']} steps)"
    if rows:
        fig = _plot_wafer_steps(plt, rows, profile, report, title)
    else:
        fig = _plot_client_steps(plt, profile, title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _plot_wafer_steps(plt, rows: list[dict], profile: dict, report: dict, title: str):
    """Three panels over the steps: the shares of the wafer's time, samples/s, buffer fill."""
    fig, axes = plt.subplots(3, 1, figsize=(7.5, 7.2), dpi=120, sharex=True,
                             gridspec_kw={"height_ratios": [1.3, 1, 0.8]})
    steps = [r["step"] for r in rows]
    shares = step_shares(rows)
    ax = axes[0]
    ax.stackplot(steps, *[[100 * v for v in shares[k]] for k in SHARE_COLOURS],
                 labels=[f"{k} {_mean_pct(report, k)}" for k in SHARE_COLOURS],
                 colors=list(SHARE_COLOURS.values()), alpha=0.85, step="pre")
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of the step's\nwafer time")
    ax.legend(fontsize=8, loc="lower center", ncol=3, bbox_to_anchor=(0.5, 1.0),
              title="share of the wafer's time (steady state)", title_fontsize=8,
              frameon=False)
    fig.suptitle(title, fontsize=10)
    ax = axes[1]
    ax.plot(steps, windowed_rate(rows), color="#1f77b4", label="samples/s (last 10 steps)")
    if report.get("samples_per_s"):
        ax.axhline(report["samples_per_s"], color="#1f77b4", linestyle=":", linewidth=1,
                   label=f"steady state: {report['samples_per_s']:,.0f} samples/s")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("samples/s\n(wafer)")
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[2]
    ax.plot(steps, [r.get("buffer_occupancy", 0.0) for r in rows], color="#9467bd",
            drawstyle="steps-pre")
    capacity = (profile.get("cs_config") or {}).get("input_buffer_batches")
    ax.set_ylim(0, max(capacity or 0, max(r.get("buffer_occupancy", 0.0) for r in rows)) + 0.5)
    ax.set_ylabel("batches ready\nin the buffer")
    ax.set_xlabel("step")
    for a in axes:
        a.grid(alpha=0.3)
    return fig


def _plot_client_steps(plt, profile: dict, title: str):
    """samples/s over the last 10 steps on the client's clock (a run without a wafer)."""
    fig, ax = plt.subplots(figsize=(7.5, 4), dpi=120)
    recs = sorted(profile.get("steps", []), key=lambda r: r["step"])
    steps, rates = [], []
    for k, r in enumerate(recs):
        lo = max(0, k - 9)
        start = recs[lo].get("client_start_unix")
        end = r.get("client_end_unix")
        if start is not None and end is not None and end > start:
            steps.append(r["step"])
            rates.append(sum(int(x.get("samples", 0)) for x in recs[lo:k + 1]) / (end - start))
    ax.plot(steps, rates, label="samples/s (client, last 10 steps)")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("samples/s")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return fig


def _mean_pct(report: dict, share: str) -> str:
    from executor.report import pct

    key = {"compute": "utilisation", "input-starved": "starved_fraction",
           "client-bound": "client_bound_fraction"}[share]
    v = report.get(key)
    return "-" if v is None else pct(v)


def plot_workers(report: dict, path: Path, title: str):
    """workers.png: per input worker, the batches/s it delivered to the wafer and its own
    production time per batch (both axes from 0); None for a run without per-worker figures."""
    workers = report.get("workers") or []
    if not workers:
        return None
    from executor.report import pct

    plt = _pyplot()
    labels = [f"CS-X {w['csx']}\nworker {w['worker']}" for w in workers]
    xs = list(range(len(workers)))
    produce = [w.get("produce_s_per_batch") for w in workers]
    timed = all(p is not None for p in produce)
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(9 if timed else 5.5, 4), dpi=120,
                             squeeze=False)
    ax = axes[0][0]
    ax.bar(xs, [w["batches_per_s"] for w in workers], color="#1f77b4", width=0.6)
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("batches/s")
    ax.set_title("delivered to the wafer (steady state)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    if timed:
        ax = axes[0][1]
        ax.bar(xs, [1000 * p for p in produce], color="#ff7f0e", width=0.6)
        for x, w in zip(xs, workers):
            rate = w["produce_batches_per_s"]
            ax.annotate(f"{rate:,.1f}/s" if rate < 100 else f"{rate:,.0f}/s", (x, 1000 * produce[x]),
                        textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
        ax.set_xticks(xs, labels, fontsize=8)
        ax.set_ylim(0, 1000 * max(produce) * 1.15 or 1)
        ax.set_ylabel("ms per batch")
        spread = report.get("worker_rate_spread")
        ax.set_title("own production time per batch (label: the rate it allows)"
                     + (f"\nproduction-rate spread {pct(spread)}" if spread is not None else ""),
                     fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_sweep(rows: list[dict], target: float, path: Path, title: str, best: dict,
               note: Optional[list] = None) -> Path:
    """sweep.png: samples/s (left axis, from 0) and wafer utilisation (right axis, 0-100%)
    against workers per CS-X, one colour per CS-X count; the smallest worker count reaching
    ``target`` marked; ``note`` (the sweep's answer, a list of lines) printed under the plot."""
    import textwrap

    plt = _pyplot()
    xs = sorted({r["num_workers_per_csx"] for r in rows})
    wrapped = [w for line in (note or []) for w in textwrap.wrap(
        line.strip(), 118, subsequent_indent="    ")]
    fig, ax = plt.subplots(figsize=(7, 4.2 + 0.14 * len(wrapped)), dpi=120)
    ax2 = ax.twinx()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, c in enumerate(sorted({r["num_csx"] for r in rows})):
        pts = sorted((r for r in rows if r["num_csx"] == c), key=lambda r: r["num_workers_per_csx"])
        x = [r["num_workers_per_csx"] for r in pts]
        colour = colours[i % len(colours)]
        ax.plot(x, [r.get("samples_per_s") or 0 for r in pts], "o-", color=colour,
                label=f"samples/s, {c} CS-X")
        ax2.plot(x, [100 * (r.get("utilisation") or 0) for r in pts], "s--", color=colour,
                 alpha=0.7, label=f"utilisation, {c} CS-X")
        if best.get(c) is not None:
            b = best[c]
            ax.axvline(b, color=colour, linestyle=":", linewidth=1.5)
            left = b == xs[-1] and len(xs) > 1
            ax2.annotate(f"{b} workers/CS-X\nreach {target:.0%}", (b, 100 * target),
                         textcoords="offset points", xytext=(-6 if left else 6, -30),
                         ha="right" if left else "left", fontsize=8, color=colour)
    ax2.axhline(100 * target, color="grey", linewidth=0.8, linestyle="-.",
                label=f"target {target:.0%}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlim(xs[0] / 1.25, xs[-1] * 1.25)
    ax.set_xlabel("input workers per CS-X")
    ax.set_ylabel("samples/s (wafer)")
    ax2.set_ylabel("wafer utilisation (%)")
    ax2.set_ylim(0, 105)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if wrapped:
        height = fig.get_figheight()
        fig.subplots_adjust(bottom=(0.14 * len(wrapped) + 0.55) / height)
        fig.text(0.01, 0.01, "\n".join(wrapped), fontsize=6.5, family="monospace", va="bottom")
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


TRACK_COLOURS = {"produce": "#ff7f0e", "transfer": "#bcbd22", "input wait": "#d62728",
                 "compute": "#2ca02c"}


def plot_timeline(trace: dict, path: Path, title: str, seconds: float = 2.0,
                  start_s: Optional[float] = None) -> Path:
    """timeline.png: ``seconds`` of the trace (from ``start_s``; default: the start of the
    wafer's second step, after start-up) as one row per track -- every worker's production and
    transfers, the wafer's input waits and compute, the client's steps and closures."""
    plt = _pyplot()
    events = trace.get("traceEvents", [])
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] in ("thread_name", "process_name")}
    spans = [e for e in events if e.get("ph") == "X"]
    if start_s is None:
        computes = sorted(e["ts"] for e in spans if e["name"] == "compute")
        start_s = computes[1] / 1e6 if len(computes) > 1 else 0.0
    lo, hi = start_s * 1e6, (start_s + seconds) * 1e6
    tracks = sorted({(e["pid"], e["tid"]) for e in spans},
                    key=lambda t: (0 if t[0] >= 10 else t[0], t[0], t[1]))
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(tracks) + 1.6), dpi=120)
    labels = []
    for row, (pid, tid) in enumerate(tracks):
        proc = names.get((pid, None), str(pid)).split(" (")[0]
        labels.append(f"{proc}: {names.get((pid, tid), tid)}")
        for e in spans:
            if (e["pid"], e["tid"]) != (pid, tid) or e["ts"] + e["dur"] < lo or e["ts"] > hi:
                continue
            colour = TRACK_COLOURS.get(e["name"], "#1f77b4" if e["name"].startswith("step ")
                                       else "#9467bd")
            ax.broken_barh([((e["ts"] - lo) / 1e3, max(e["dur"] / 1e3, 0.05))],
                           (row - 0.35, 0.7), color=colour, edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(tracks)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, seconds * 1e3)
    ax.set_xlabel(f"ms from {start_s:.2f} s into the run")
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=n) for n, c in TRACK_COLOURS.items()]
    handles += [Patch(color="#1f77b4", label="client step"),
                Patch(color="#9467bd", label="closure / start-up phase")]
    ax.legend(handles=handles, fontsize=7, ncol=6, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    fig.suptitle(title, fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
