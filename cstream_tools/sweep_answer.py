"""The answer of ``cstream sweep``: how many input workers per CS-X keep the wafer busy.

From a sweep's rows (one per worker count) and the wafer's speed, :func:`answer` gives

* the fewest workers per CS-X that keep the wafer at least ``target`` busy;
* what one worker produces (batches/s while producing, measured in the workers) and what it
  costs (CPU seconds per batch, measured in the workers), at the sweep's smallest count;
* what limited the largest count: the wafer (it was kept busy), the client (the wafer waited
  for it more than for input), this machine's cores (the workers' CPU demand reached
  :data:`CORES_BOUND_SHARE` of them, or the input buffer was full and the wafer still lost time)
  or the pipeline (cores were free and the wafer starved: more workers, or a faster processor,
  help);
* an extrapolation to ``num_csx`` CS-Xs fed by ``K`` input nodes of ``C`` cores each, from
  the per-worker rate and CPU cost (not measured; stated as such).

The wafer's speed comes given on the command line or from the Model Zoo program
(:class:`cstream_tools.modelzoo_input.WaferSpeed` says which).
"""

from __future__ import annotations

import math
from typing import Optional

from workers.checks import positive_int

CORES_BOUND_SHARE = 0.75
"""Input workers whose CPU demand reaches this share of the machine's cores are limited by
the cores: more of them share the same cores."""


# -- figures per row -------------------------------------------------------------------------------
def worker_figures(report: dict) -> dict:
    """A sweep row's per-worker figures from a run's report: the median production rate
    (batches/s while producing), CPU seconds per batch delivered, and the batch per CS-X."""
    workers = report.get("workers") or []
    rates = sorted(w["produce_batches_per_s"] for w in workers
                   if w.get("produce_batches_per_s") is not None)
    delivered = sum(w.get("batches_per_s") or 0.0 for w in workers)
    cores = [w.get("cpu_cores") for w in workers]
    steps, samples = report.get("steps"), report.get("samples")
    return {
        "worker_batches_per_s": rates[len(rates) // 2] if rates else None,
        "worker_cpu_s_per_batch": (sum(cores) / delivered if cores and delivered > 0
                                   and all(c is not None for c in cores) else None),
        "samples_per_batch": samples / steps if steps else None,
    }


# -- the answer ------------------------------------------------------------------------------------
def _wafer_rate(rows: list[dict], experiment: Optional[dict]) -> Optional[float]:
    cs = (experiment or {}).get("cs_config") or {}
    if cs.get("wafer_samples_per_sec"):
        return float(cs["wafer_samples_per_sec"])
    if cs.get("wafer_seconds_per_step") and rows and rows[0].get("samples_per_batch"):
        return rows[0]["samples_per_batch"] / rows[0]["num_csx"] / cs["wafer_seconds_per_step"]
    return None


def _limit(row: dict, target: float) -> dict:
    util = row.get("utilisation") or 0.0
    cores, cpus = row.get("input_cpu_cores"), row.get("machine_cpus")
    occupancy, depth = row.get("mean_buffer_occupancy"), row.get("buffer_batches")
    w = row["num_workers_per_csx"]
    if util >= target:
        return {"by": "wafer", "text": f"the wafer: {util:.1%} busy at {w} workers per CS-X, "
                                       "the input kept up"}
    starved, client = row.get("starved_fraction") or 0.0, row.get("client_bound_fraction") or 0.0
    if client > starved and client > 0.02:
        return {"by": "client", "text": f"the client: at {w} workers per CS-X the wafer waited "
                                        f"{client:.0%} of its time for the client (the loop that "
                                        f"hands it steps) and {starved:.0%} for input; more "
                                        "workers cannot help"}
    if ((cores is not None and cpus and cores >= CORES_BOUND_SHARE * cpus)
            or (occupancy is not None and depth and occupancy >= 0.5 * depth)):
        used = f" (the workers used {cores:.2f} of {cpus})" if cores is not None and cpus else ""
        return {"by": "cores", "text": f"this machine's cores: at {w} workers per CS-X the wafer "
                                       f"was {util:.1%} busy and the workers shared its "
                                       f"{cpus} cores with the wafer{used}"}
    used = f", using {cores:.2f} of {cpus} cores" if cores is not None and cpus else ""
    return {"by": "pipeline", "text": f"the pipeline: at {w} workers per CS-X the wafer was "
                                      f"{util:.1%} busy while cores were free{used}; more "
                                      "workers (or a faster processor) help"}


KEPT_UP_SHARE = 0.75
"""An input buffer this full, on average, when steps began means the workers kept up."""


def _input_kept_up(rows: list[dict], fewest: Optional[dict]) -> Optional[str]:
    """A note where a count below the fewest (or any count, without one) already kept the
    input buffer full: the wafer then lost its time taking batches on the shared cores, not
    waiting for the workers, and that count may suffice on a cluster."""
    for r in rows:
        if fewest is not None and r["num_workers_per_csx"] >= fewest["num_workers_per_csx"]:
            return None
        occupancy, depth = r.get("mean_buffer_occupancy"), r.get("buffer_batches")
        if occupancy is not None and depth and occupancy >= KEPT_UP_SHARE * depth:
            w = r["num_workers_per_csx"]
            return (f"at {w} worker{'s' if w != 1 else ''} per CS-X the input buffer already held "
                    f"{occupancy:.1f} of its {depth} batches when steps began, so the workers kept "
                    f"up (the wafer waited {r.get('starved_fraction') or 0.0:.1%} of its time for "
                    f"input and {r.get('client_bound_fraction') or 0.0:.1%} for the client, on "
                    f"this machine's shared cores); {w} per CS-X may suffice where the wafer and "
                    "its client have cores of their own")
    return None


def extrapolate(*, wafer_samples_per_s: float, samples_per_batch: float,
                worker_batches_per_s: float, cpu_s_per_batch: Optional[float], num_csx: int,
                target: float, nodes: Optional[int] = None,
                cores_per_node: Optional[int] = None) -> dict:
    """Workers and cores for ``num_csx`` CS-Xs at the wafer's speed, from one worker's rate and
    CPU cost; with ``nodes`` x ``cores_per_node``, whether they fit.

    >>> e = extrapolate(wafer_samples_per_s=200, samples_per_batch=8, worker_batches_per_s=10,
    ...                 cpu_s_per_batch=0.02, num_csx=4, target=0.95, nodes=2, cores_per_node=1)
    >>> e["workers_per_csx"], e["cores"], e["cores_per_node"], e["fits"], e["nodes_needed"]
    (3, 2.0, 1.0, True, 2)
    """
    batches_per_s = wafer_samples_per_s / samples_per_batch  # per CS-X, at the wafer's speed
    per_csx = math.ceil(target * batches_per_s / worker_batches_per_s - 1e-9)
    out = {"num_csx": num_csx, "workers_per_csx": per_csx, "workers": per_csx * num_csx,
           "batches_per_s_per_csx": batches_per_s, "cores": None, "nodes": nodes,
           "cores_per_node_available": cores_per_node, "cores_per_node": None, "fits": None,
           "nodes_needed": None}
    if cpu_s_per_batch is not None:
        cores = num_csx * batches_per_s * cpu_s_per_batch
        out["cores"] = cores
        if cores_per_node:
            out["nodes_needed"] = max(1, math.ceil(cores / cores_per_node - 1e-9))
        if nodes and cores_per_node:
            per_node = cores * math.ceil(out["workers"] / nodes) / out["workers"]
            out.update(cores_per_node=per_node, fits=per_node <= cores_per_node)
    return out


def answer(rows: list[dict], target: float, experiment: Optional[dict] = None,
           wafer_speed: Optional[dict] = None, plan: Optional[dict] = None,
           notes: Optional[list] = None) -> Optional[dict]:
    """The sweep's answer for its first CS-X count (see the module docstring); None without
    rows. ``plan``: ``{"num_csx", "nodes", "cores_per_node"}`` for the extrapolation;
    ``notes``: what the figures leave out, printed with them."""
    if not rows:
        return None
    csx = min(r["num_csx"] for r in rows)
    rows = sorted((r for r in rows if r["num_csx"] == csx), key=lambda r: r["num_workers_per_csx"])
    reached = [r for r in rows if r.get("utilisation") is not None and r["utilisation"] >= target]
    fewest = reached[0] if reached else None
    wafer_rate = _wafer_rate(rows, experiment)
    if wafer_speed is None:
        cs = (experiment or {}).get("cs_config") or {}
        source = ("the experiment's cs_config (or --wafer-samples-per-sec / "
                  "--wafer-seconds-per-step)" if wafer_rate else
                  "none: the wafer ran as fast as its step, so every count starves it")
        wafer_speed = {"samples_per_s": wafer_rate, "source": source, "caveat": None}
        del cs
    base = rows[0]
    batch = base.get("samples_per_batch")
    per_csx_batch = batch / base["num_csx"] if batch else None
    produced = base.get("worker_batches_per_s")
    # what one worker got to the wafer: all of it was wanted where the wafer starved, so it
    # bounds the worker's rate with the transfer included (production alone leaves it out)
    delivered = (base["samples_per_s"] / batch / base["num_workers_per_csx"]
                 if base.get("samples_per_s") and batch else None)
    starved = (base.get("utilisation") or 0.0) < target
    rate = min(produced, delivered) if produced and delivered and starved else produced
    worker = {"measured_at_workers_per_csx": base["num_workers_per_csx"],
              "batches_per_s": produced,
              "delivered_batches_per_s": delivered,
              "extrapolation_batches_per_s": rate,
              "samples_per_s": rate * per_csx_batch if rate and per_csx_batch else None,
              "cpu_s_per_batch": base.get("worker_cpu_s_per_batch")}
    out = {"target": target, "num_csx": csx, "wafer": wafer_speed,
           "fewest_workers_per_csx": fewest["num_workers_per_csx"] if fewest else None,
           "utilisation_at_fewest": fewest["utilisation"] if fewest else None,
           # the wafer's own speed where it was kept busy (its pacing may fall short of it)
           "wafer_reached_samples_per_s": (fewest["samples_per_s"] / csx
                                           if fewest and fewest.get("samples_per_s") else None),
           "worker": worker, "largest": {"workers_per_csx": rows[-1]["num_workers_per_csx"],
                                         **_limit(rows[-1], target)},
           "extrapolation": None, "notes": list(notes or [])}
    kept_up = _input_kept_up(rows, fewest)
    if kept_up is not None:
        out["notes"].append(kept_up)
    plan = plan or {}
    if wafer_rate and per_csx_batch and rate:
        out["extrapolation"] = extrapolate(
            wafer_samples_per_s=wafer_rate, samples_per_batch=per_csx_batch,
            worker_batches_per_s=rate, cpu_s_per_batch=worker["cpu_s_per_batch"],
            num_csx=plan.get("num_csx") or csx, target=target, nodes=plan.get("nodes"),
            cores_per_node=plan.get("cores_per_node"))
    return out


def answer_lines(a: Optional[dict]) -> list[str]:
    """The answer as the sweep prints it."""
    if a is None:
        return []
    wafer = a["wafer"]
    speed = (f"{wafer['samples_per_s']:,.1f} samples/s per CS-X" if wafer.get("samples_per_s")
             else "unpaced")
    lines = [f"answer (num_csx={a['num_csx']}, wafer {speed}; speed from {wafer['source']}):"]
    if wafer.get("caveat"):
        lines.append(f"  note: {wafer['caveat']}")
    reached = a.get("wafer_reached_samples_per_s")
    if reached and wafer.get("samples_per_s") and reached < 0.9 * wafer["samples_per_s"]:
        lines.append(f"  note: the simulated wafer reached {reached:,.1f} samples/s per CS-X, "
                     f"{reached / wafer['samples_per_s']:.0%} of its set speed (its pacing "
                     "shares this machine's cores); the counts hold for the speed it reached")
    if a["fewest_workers_per_csx"] is not None:
        lines.append(f"  fewest workers per CS-X keeping the wafer >= {a['target']:.0%} busy: "
                     f"{a['fewest_workers_per_csx']} ({a['utilisation_at_fewest']:.1%} busy)")
    else:
        lines.append(f"  no worker count in the sweep keeps the wafer >= {a['target']:.0%} busy")
    w = a["worker"]
    if w["batches_per_s"] is not None:
        cost = (f", {w['cpu_s_per_batch'] * 1000:.1f} CPU-ms per batch"
                if w["cpu_s_per_batch"] is not None else "")
        got = (f", {w['delivered_batches_per_s']:,.1f} delivered to the wafer"
               if w.get("delivered_batches_per_s") else "")
        lines.append(f"  one worker: {w['batches_per_s']:,.1f} batches/s while producing{got}"
                     f"{cost} (measured at {w['measured_at_workers_per_csx']} per CS-X)")
    lines += [f"  note: {n}" for n in a.get("notes") or []]
    lines.append(f"  largest count ({a['largest']['workers_per_csx']} per CS-X) limited by "
                 f"{a['largest']['text']}")
    e = a["extrapolation"]
    if e is not None:
        rate = (f" ({w['extrapolation_batches_per_s']:,.1f} batches/s"
                + (f", {w['samples_per_s']:,.1f} samples/s" if w["samples_per_s"] else "") + ")")
        text = (f"  extrapolation from one worker's rate{rate} and cost (not measured): "
                f"{e['num_csx']} CS-X need {e['workers_per_csx']} "
                f"worker{'s' if e['workers_per_csx'] != 1 else ''} per CS-X ({e['workers']} in all)")
        if e["cores"] is not None:
            text += f" and {e['cores']:.2f} cores of input work"
            if e["fits"] is not None:
                text += (f"; on {e['nodes']} input nodes x {e['cores_per_node_available']} cores: "
                         f"{e['cores_per_node']:.2f} cores per node, "
                         + ("fits" if e["fits"] else
                            f"does not fit (needs {e['nodes_needed']} such nodes)"))
            elif e["nodes_needed"] is not None:
                text += f" ({e['nodes_needed']} nodes of {e['cores_per_node_available']} cores)"
        lines.append(text)
    return lines


# -- the command line ------------------------------------------------------------------------------
def add_arguments(p) -> None:
    """The extrapolation's cluster, on ``cstream sweep``."""
    g = p.add_argument_group("the answer's extrapolation to a cluster")
    g.add_argument("--plan-num-csx", type=int, metavar="N",
                   help="CS-Xs to extrapolate the workers and cores for (default: the sweep's)")
    g.add_argument("--input-nodes", type=int, metavar="K", help="input nodes in the cluster")
    g.add_argument("--cores-per-node", type=int, metavar="C", help="cores of each input node")


def plan_of(args) -> dict:
    """The extrapolation's cluster from the command line; ValueError for bad values."""
    plan = {"num_csx": getattr(args, "plan_num_csx", None),
            "nodes": getattr(args, "input_nodes", None),
            "cores_per_node": getattr(args, "cores_per_node", None)}
    for key, flag in (("num_csx", "--plan-num-csx"), ("nodes", "--input-nodes"),
                      ("cores_per_node", "--cores-per-node")):
        positive_int(plan[key], flag, allow_none=True)
    if (plan["nodes"] is None) != (plan["cores_per_node"] is None):
        raise ValueError("give --input-nodes and --cores-per-node together (K nodes of C cores)")
    return plan
