"""Training speed as users get it: cstream's simulated wafer against eager PyTorch, end to end.

Every measurement runs in its own process, started the way a user starts a script, with Ray
embedded; variants are interleaved (A B C D A B C D ...) over ``--rounds`` rounds and medians
reported, because this machine is noisy.

* **Training** -- three models, each trained with Adam on data already in memory:
  MLP 784-512-512-10 (batch 64), MLP 16-64-64-4 (batch 16), and the small transformer LM
  ``cstream_tools.models.TinyLM`` (2 x d128, seq 64, batch 8). Variants:

  - ``eager``: plain PyTorch, ``torch.optim.Adam(foreach=True)``, a torch DataLoader over the
    same in-memory data, and a Python callback after each step that reads ``loss.item()``;
  - ``csx_default``: ``cstream.backend("CSX")`` with its defaults (Ray driver actor);
  - ``csx_in_process``: ``in_process=True``;
  - ``csx_inductor``: ``compiler="inductor"``;

  all CSX variants with 2 input workers (``CSConfig(num_csx=1, num_workers_per_csx=2)``) and
  the loop of Cerebras' porting guide, ``for batch in executor: loss = training_step(batch);
  post_training_step(loss)``, ``post_training_step`` a step closure reading ``loss.item()``;
  each once with the closure every step and once without. Steady-state steps/s come from
  timestamps taken in the closure (without one: at the end of each loop iteration) over steps
  20%..95% of the run; where the run summary names a tiered-compilation switch step, the rate
  after it is reported too. Ratios are against eager in the same run.
* **Consumption ceiling** -- no model: a DataExecutor over ready 16x16 float batches, on the Ray
  path and in-process, beside torch's DataLoader with ``num_workers=0`` and ``2``.
* **Time to first step** -- from the parent launching ``python train_throughput.py`` (and from the
  first line of the script) to the first step closure, with a fresh compile cache (cold) and
  again in a second process with the same ``compile_dir`` (warm): ``compiler="fx"``, the
  default compiler when it is not ``fx``, and ``compiler="inductor"`` (not with ``--quick``).

The wafer's own figures are read from the run summary where they exist (per-step ``compute_s``,
the start-up breakdown, the compile report, thread counts, tiered-compilation fields).

Writes ``benchmarks/results/train_throughput.json`` and prints tables; ``--docs`` also
rewrites the generated block of docs/performance.md from the results.

    python -m benchmarks.train_throughput [--rounds 3] [--quick] [--docs]
"""

from __future__ import annotations

import time

T_SCRIPT_START = time.time()  # before any import: a child's time to first step starts here

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Optional  # noqa: E402

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
from benchmarks.docs_table import update_block  # noqa: E402
from benchmarks.machine import describe, revision  # noqa: E402

RESULT_TAG = "TRAIN_THROUGHPUT_RESULT "
DOCS_BLOCK = "train_throughput.py"  # the name of docs/performance.md's generated block

MODEL_LABELS = {
    "mlp_784_512_512_10_b64": "MLP 784-512-512-10, batch 64, Adam",
    "mlp_16_64_64_4_b16": "MLP 16-64-64-4, batch 16, Adam",
    "transformer_lm_2x128_seq64_b8": "small transformer LM (2 × d128, seq 64, batch 8), Adam",
}
#: steps per training run: a few seconds of steady state for the slowest variant; the LM's
#: about 10 s (its 400-step runs, 5 s, gave eager 68, 83 and 86 steps/s in three rounds of one
#: run on a 2-core machine)
TRAIN_STEPS = {"mlp_784_512_512_10_b64": 1500, "mlp_16_64_64_4_b16": 6000,
               "transformer_lm_2x128_seq64_b8": 1200}
QUICK_TRAIN_STEPS = {"mlp_784_512_512_10_b64": 300, "mlp_16_64_64_4_b16": 1500,
                     "transformer_lm_2x128_seq64_b8": 80}
# inductor before the default: with tiered compilation the default then finds inductor's
# artifacts in the shared compile_dir, as a user's second run does
CSX_VARIANTS = {
    "csx_inductor": {"compiler": "inductor"},
    "csx_default": {},
    "csx_in_process": {"in_process": True},
}
TRAIN_VARIANTS = ["eager", *CSX_VARIANTS]
SHOWN_VARIANTS = ["eager", "csx_default", "csx_in_process", "csx_inductor"]  # table columns
VARIANT_LABELS = {"eager": "eager PyTorch", "csx_default": "CSX default (Ray driver)",
                  "csx_in_process": "CSX `in_process=True`",
                  "csx_inductor": 'CSX `compiler="inductor"`'}
#: --quick runs these without a closure only with one: a smoke run, not a measurement
QUICK_SKIPS_WITHOUT_CLOSURE = ("csx_in_process", "csx_inductor")
CONSUME_VARIANTS = ["csx_ray", "csx_in_process", "torch_dataloader_0", "torch_dataloader_2"]
CONSUME_STEPS, QUICK_CONSUME_STEPS = 8000, 3000
STARTUP_STEPS = 20
STEADY_FROM, STEADY_TO = 0.20, 0.95  # the steady window, as fractions of the run's steps


# ================================================================================================
# The child: one measurement in its own process, one JSON line on stdout
# ================================================================================================
def steady_window(n: int, start: int = 0) -> tuple[int, int]:
    """``[lo, hi)``: the steps of a run of ``n`` steps whose timestamps define its steady rate."""
    return max(int(n * STEADY_FROM), start, 1), max(int(n * STEADY_TO), 2)


def rate(times: list, lo: int, hi: int):
    """Steps/s between timestamps ``lo`` and ``hi - 1`` (None when too few)."""
    if hi - lo < 3 or times[hi - 1] <= times[lo]:
        return None
    return (hi - 1 - lo) / (times[hi - 1] - times[lo])


def make_model(name: str):
    from benchmarks.bench_data import LM, TRAIN_MODELS, mlp

    sizes = TRAIN_MODELS[name]["sizes"]
    if sizes is None:
        from cstream_tools.models import TinyLM

        return TinyLM(**LM)
    return mlp(sizes)


def loss_fn(out, y):
    import torch

    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _scalars(obj, prefix: str = "", depth: int = 0) -> dict:
    """The scalar leaves of a (nested) dict, keyed by their dotted path."""
    out = {}
    if not isinstance(obj, dict) or depth > 4:
        return out
    for k, v in obj.items():
        path = f"{prefix}{k}"
        if isinstance(v, (bool, int, float, str)) or v is None:
            out[path] = v
        elif isinstance(v, dict):
            out.update(_scalars(v, path + ".", depth + 1))
    return out


def engine_figures(executor, backend, lo: int, hi: int) -> dict:
    """What the run summary says about the wafer, read with .get(): fields that do not exist in
    this version of cstream are left out."""
    fig: dict = {"backend_compiler": getattr(backend, "compiler", None),
                 "backend_num_threads": getattr(backend, "num_threads", None)}
    records = executor.step_records
    window = records[lo:hi]
    compute = [r["compute_s"] for r in window if "compute_s" in r]
    if compute:
        fig["wafer_compute_ms_median"] = statistics.median(compute) * 1e3
    ends = [r["wafer_t"] for r in window if "wafer_t" in r]
    if len(ends) > 2 and ends[-1] > ends[0]:
        fig["wafer_steps_per_s"] = (len(ends) - 1) / (ends[-1] - ends[0])
    report = executor.report or {}
    for key in ("samples_per_s", "utilisation", "starved_fraction", "client_bound_fraction",
                "time_to_first_step_s", "trace_s", "compile_s", "warmup_steps"):
        if report.get(key) is not None:
            fig[f"report.{key}"] = report[key]
    summary = executor.summary or {}
    fig.update({f"summary.{k}": v for k, v in _scalars(summary).items()
                if not k.startswith("workers")})
    if fig["backend_num_threads"] is None:  # the driver's thread count, where a summary says
        fig["backend_num_threads"] = next(
            (v for k, v in fig.items() if k.startswith("summary.") and k.endswith("num_threads")
             and v is not None), None)
    # tiered compilation: the first step run by the switched-to program (e.g.
    # summary.compile.tier_up.switched_at_step), where the summary names one
    switch = [v for k, v in fig.items() if "switch" in k.rsplit(".", 1)[-1].lower()
              and k.lower().endswith("step") and isinstance(v, int) and not isinstance(v, bool)]
    if switch:
        fig["tiered_switch_step"] = switch[0]
    return fig


def child_train(spec: dict) -> dict:
    import torch

    from benchmarks.bench_data import memory_input_fn

    closure = spec["closure"]
    steps = spec["steps"]
    times: list = []
    losses: list = []
    first_step_time = []

    def record(loss=None):
        times.append(time.perf_counter())
        if loss is not None:
            losses.append(loss.item())
        if not first_step_time:
            first_step_time.append(time.time())

    if spec["variant"] == "eager":
        torch.manual_seed(0)
        model = make_model(spec["model"])
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
        loader = memory_input_fn(spec["model"], sharded=False)
        step = 0
        while step < steps:  # epochs until num_steps, as the DataExecutor cycles its loader
            for x, y in loader:
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                record(loss if closure else None)
                step += 1
                if step == steps:
                    break
        executor = backend = None
    else:
        import cstream as cstorch

        if spec["variant"] == "cpu_backend":  # eager in this process (benchmarks/heap.py)
            backend = cstorch.backend("CPU", artifact_dir=spec["artifact_dir"])
        else:
            variant_options = spec.get("csx_options", CSX_VARIANTS.get(spec["variant"]))
            options = {"artifact_dir": spec["artifact_dir"], "compile_dir": spec["compile_dir"],
                       **variant_options}
            backend = cstorch.backend("CSX", **options)
        torch.manual_seed(0)
        model = make_model(spec["model"])
        compiled_model = cstorch.compile(model, backend)
        optimizer = cstorch.optim.Adam(model.parameters(), lr=1e-3)

        @cstorch.compile_step
        def training_step(batch):
            inputs, targets = batch
            loss = loss_fn(compiled_model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        @cstorch.step_closure
        def post_training_step(loss):
            record(loss)

        dataloader = cstorch.utils.data.DataLoader(memory_input_fn, spec["model"])
        executor = cstorch.utils.data.DataExecutor(
            dataloader, num_steps=steps,
            cs_config=cstorch.utils.CSConfig(num_csx=1, num_workers_per_csx=2))
        for batch in executor:
            loss = training_step(batch)
            if closure:
                post_training_step(loss)
            else:
                record()
    lo, hi = steady_window(len(times))
    out = {"steps": len(times), "window": [lo, hi], "steps_per_s": rate(times, lo, hi),
           "torch_threads": torch.get_num_threads(),
           "time_to_first_step_s": first_step_time[0] - spec["launch_time"],
           "time_to_first_step_from_script_start_s": first_step_time[0] - T_SCRIPT_START}
    if losses:
        out["loss_first"], out["loss_last"] = losses[0], losses[-1]
    if executor is not None:
        fig = engine_figures(executor, backend, lo, hi)
        out["engine"] = fig
        if not closure:
            # nothing waits for the wafer inside the loop: the client runs up to the look-ahead
            # ahead of it, and its iterations say how fast steps were queued, not run. The
            # steps' rate is the wafer's, over the same steps
            out["client_steps_per_s"] = out["steps_per_s"]
            out["steps_per_s"] = fig.get("wafer_steps_per_s")
        switch = fig.get("tiered_switch_step")
        if switch is not None:
            lo2, hi2 = steady_window(len(times), start=switch - 1)
            # the steps' own end times without a closure (see above)
            ends = times if closure else [r["wafer_t"] for r in executor.step_records]
            out["steps_per_s_after_switch"] = rate(ends, lo2, hi2) if hi2 - lo2 >= 20 else None
        backend.shutdown()
    return out


def child_consume(spec: dict) -> dict:
    import torch

    from benchmarks.bench_data import ReadyBatches, ready_batches_input_fn

    steps = spec["steps"]
    times: list = []
    variant = spec["variant"]
    executor = backend = None
    if variant.startswith("torch_dataloader"):
        workers = int(variant.rsplit("_", 1)[1])
        loader = torch.utils.data.DataLoader(ReadyBatches(steps), batch_size=None,
                                             num_workers=workers)
        for _ in loader:
            times.append(time.perf_counter())
    else:
        import cstream as cstorch

        backend = cstorch.backend("CSX", artifact_dir=spec["artifact_dir"],
                                  compile_dir=spec["compile_dir"],
                                  in_process=variant == "csx_in_process")
        loader = cstorch.utils.data.DataLoader(ready_batches_input_fn, steps)
        executor = cstorch.utils.data.DataExecutor(
            loader, num_steps=steps,
            cs_config=cstorch.utils.CSConfig(num_csx=1, num_workers_per_csx=2))
        for _ in executor:  # no traced step: the wafer only consumes
            times.append(time.perf_counter())
    lo, hi = steady_window(len(times))
    out = {"steps": len(times), "window": [lo, hi], "batches_per_s": rate(times, lo, hi)}
    if executor is not None:
        out["engine"] = engine_figures(executor, backend, lo, hi)
        backend.shutdown()
    return out


def child_main(spec: dict) -> None:
    result = (child_consume if spec["kind"] == "consume" else child_train)(spec)
    print(RESULT_TAG + json.dumps(result, default=str), flush=True)


# ================================================================================================
# The parent: launch the children, interleaved, and gather medians
# ================================================================================================
def launch(spec: dict, timeout_s: float, env: dict | None = None, retries: int = 1) -> dict:
    """Run one child (``python train_throughput.py --child SPEC``); its result or its error.

    A child that fails is run again up to ``retries`` times (on a loaded machine Ray's start-up
    can time out); the errors of the failed attempts are kept under ``failed_attempts``."""
    failed = []
    waited, idle = wait_for_load()
    for _ in range(retries + 1):
        res = _launch_once(spec, timeout_s, env)
        if "error" not in res:
            break
        failed.append(res["error"])
        waited_again, idle = wait_for_load()
        waited += waited_again
    if failed:
        res["failed_attempts"] = failed
    if waited:
        res["waited_for_load_s"] = waited
    if idle is not None:
        res["cpu_idle_before_launch"] = idle
    return res


#: --wait-for-load: the 1-minute load average a child waits for, and for at most how long
LOAD_GATE = {"max_load": None, "max_wait_s": 120.0}
#: with --wait-for-load, a child also waits until the machine's CPU was at least this idle
#: over the last IDLE_WINDOW_S: the 1-minute average lags by a minute, and a child launched
#: while the previous one's Ray processes still exit measures their teardown too
MIN_CPU_IDLE = 0.9
IDLE_WINDOW_S = 1.0


def _cpu_times() -> tuple[float, float]:
    """(idle, total) jiffies of the whole machine (Linux /proc/stat); (0, 0) elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    return fields[3] + (fields[4] if len(fields) > 4 else 0.0), sum(fields[:8])


def cpu_idle_fraction(window_s: float = IDLE_WINDOW_S) -> float | None:
    """The share of the machine's CPU time that was idle over the next ``window_s`` seconds;
    None where /proc/stat is not there."""
    idle0, total0 = _cpu_times()
    time.sleep(window_s)
    idle1, total1 = _cpu_times()
    return None if total1 <= total0 else (idle1 - idle0) / (total1 - total0)


def wait_for_load() -> tuple[float, float | None]:
    """Wait (at most ``max_wait_s``) until the 1-minute load average is at most ``max_load``
    and the CPU was at least :data:`MIN_CPU_IDLE` idle over the last second; the seconds
    waited and that last idle share (None when not gated or not measurable)."""
    if LOAD_GATE["max_load"] is None:
        return 0.0, None
    t0 = time.perf_counter()
    while True:
        idle = cpu_idle_fraction()
        quiet = (os.getloadavg()[0] <= LOAD_GATE["max_load"]
                 and (idle is None or idle >= MIN_CPU_IDLE))
        if quiet or time.perf_counter() - t0 >= LOAD_GATE["max_wait_s"]:
            return time.perf_counter() - t0, idle


def _launch_once(spec: dict, timeout_s: float, env: dict | None) -> dict:
    spec = {**spec, "launch_time": time.time()}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        **(env or {})}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              env=child_env, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s", "loadavg_1m": load}
    wall = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return {**json.loads(line[len(RESULT_TAG):]), "process_wall_s": wall,
                    "loadavg_1m": load}
    tail = (proc.stderr or proc.stdout)[-2000:]
    return {"error": f"exit code {proc.returncode}: {tail}", "loadavg_1m": load}


def brief(res: dict, key: str, fmt: str, unit: str) -> str:
    """One child's figure for the progress lines (an error: its last line)."""
    if "error" in res:
        return "FAILED: " + (res["error"].strip().splitlines() or [""])[-1][:200]
    return f"{_num(res.get(key), fmt)} {unit}"


def median_of(runs: list, key: str):
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def trial_figures(runs: list) -> Optional[dict]:
    """The tiering trial's median step time of each candidate (ms, median over the runs whose
    summary records a trial) and the compilers it chose; None where no run had a trial."""
    figs = [x.get("engine", {}) for x in runs]
    trials = [f for f in figs if f.get("summary.compile.tier_up.trial.fx_median_s") is not None]
    if not trials:
        return None
    key = "summary.compile.tier_up.trial."
    return {"fx_ms": statistics.median(f[key + "fx_median_s"] for f in trials) * 1e3,
            "inductor_ms": statistics.median(f[key + "inductor_median_s"] for f in trials) * 1e3,
            "steps_each": trials[0].get(key + "steps_each"),
            "chosen": sorted({f.get(key + "chosen") or f.get("summary.compile.active")
                              for f in trials})}


def default_compiler() -> str:
    from executor.backends.options import CSXOptions

    return CSXOptions().compiler


def run_training(args, tmp: Path, results: dict) -> None:
    steps = QUICK_TRAIN_STEPS if args.quick else TRAIN_STEPS
    closures = {"with_closure": True, "without_closure": False}
    runs = {m: {c: {v: [] for v in TRAIN_VARIANTS} for c in closures} for m in args.models}
    for r in range(args.rounds):
        for m in args.models:
            for cname, closure in closures.items():
                for v in TRAIN_VARIANTS:
                    if args.quick and not closure and v in QUICK_SKIPS_WITHOUT_CLOSURE:
                        continue
                    spec = {"kind": "train", "model": m, "variant": v, "closure": closure,
                            "steps": steps[m], "artifact_dir": str(tmp / "artifacts"),
                            # one compile_dir per model for the whole benchmark, as a user's
                            # repeated runs share artifact_dir/cached_compile
                            "compile_dir": str(tmp / "compile" / m)}
                    res = launch(spec, args.timeout)
                    runs[m][cname][v].append(res)
                    show = brief(res, "steps_per_s", ",.1f", "steps/s")
                    print(f"  round {r + 1} {m} {cname} {v}: {show}", flush=True)
    table: dict = {}
    for m in args.models:
        table[m] = {}
        for cname in closures:
            entry = {}
            eager = median_of(runs[m][cname]["eager"], "steps_per_s")
            for v in TRAIN_VARIANTS:
                vr = runs[m][cname][v]
                med = median_of(vr, "steps_per_s")
                e = {"steps_per_s": med,
                     "ratio_vs_eager": med / eager if med and eager else None,
                     "samples_steps_per_s": [x.get("steps_per_s") for x in vr],
                     "steps_per_s_after_switch": median_of(vr, "steps_per_s_after_switch"),
                     "time_to_first_step_s": median_of(vr, "time_to_first_step_s"),
                     "errors": [x["error"] for x in vr if "error" in x],
                     "runs": vr}
                if v != "eager":
                    figs = [x.get("engine", {}) for x in vr]
                    e["wafer_compute_ms_median"] = median_of(figs, "wafer_compute_ms_median")
                    e["wafer_steps_per_s"] = median_of(figs, "wafer_steps_per_s")
                    e["tiered_switch_step"] = median_of(figs, "tiered_switch_step")
                    # which version the tiering trial kept (fx vs inductor by median step time)
                    e["trial_kept"] = sorted({f["summary.compile.active"] for f in figs if
                                              "summary.compile.tier_up.trial.fx_median_s" in f})
                    threads = sorted({str(f.get("backend_num_threads")) for f in figs})
                    e["num_threads"] = threads
                entry[v] = e
            table[m][cname] = entry
    results["training"] = table


def run_consumption(args, tmp: Path, results: dict) -> None:
    steps = QUICK_CONSUME_STEPS if args.quick else CONSUME_STEPS
    runs = {v: [] for v in CONSUME_VARIANTS}
    for r in range(args.rounds):
        for v in CONSUME_VARIANTS:
            spec = {"kind": "consume", "variant": v, "steps": steps,
                    "artifact_dir": str(tmp / "artifacts"), "compile_dir": str(tmp / "compile")}
            res = launch(spec, args.timeout)
            runs[v].append(res)
            show = brief(res, "batches_per_s", ",.0f", "batches/s")
            print(f"  round {r + 1} consume {v}: {show}", flush=True)
    results["consumption"] = {
        v: {"batches_per_s": median_of(runs[v], "batches_per_s"),
            "wafer_batches_per_s": median_of([x.get("engine", {}) for x in runs[v]],
                                             "wafer_steps_per_s"),
            "samples_batches_per_s": [x.get("batches_per_s") for x in runs[v]],
            "errors": [x["error"] for x in runs[v] if "error" in x], "runs": runs[v]}
        for v in CONSUME_VARIANTS}


def run_startup(args, tmp: Path, results: dict) -> None:
    """Cold: a fresh compile_dir (inductor's own cache inside it too); warm: a second process
    with the same compile_dir."""
    compilers = {"fx": {"compiler": "fx"}}
    default = results.get("default_compiler")
    if default != "fx":
        compilers[f"default ({default})"] = {}
    if not args.quick:
        compilers["inductor"] = {"compiler": "inductor"}
    model = "mlp_784_512_512_10_b64"
    runs = {f"{c} {w}": [] for c in compilers for w in ("cold", "warm")}
    runs["eager"] = []
    for r in range(args.rounds):
        res = launch({"kind": "train", "model": model, "variant": "eager", "closure": True,
                      "steps": STARTUP_STEPS}, args.timeout)
        runs["eager"].append(res)
        for c, options in compilers.items():
            cdir = tmp / "startup" / f"{c.split()[0]}_{r}"
            for warmth in ("cold", "warm"):
                spec = {"kind": "train", "model": model, "variant": "startup", "closure": True,
                        "steps": STARTUP_STEPS, "artifact_dir": str(tmp / "artifacts"),
                        "compile_dir": str(cdir), "csx_options": options}
                # a cold run is not retried: the failed attempt may have warmed the cache
                res = launch(spec, args.timeout,
                             env={"TORCHINDUCTOR_CACHE_DIR": str(cdir / "inductor")},
                             retries=0 if warmth == "cold" else 1)
                runs[f"{c} {warmth}"].append(res)
                show = brief(res, "time_to_first_step_s", ".2f", "s")
                print(f"  round {r + 1} time to first step, {c} {warmth}: {show}", flush=True)
    results["time_to_first_step"] = {
        k: {"time_to_first_step_s": median_of(v, "time_to_first_step_s"),
            "from_script_start_s": median_of(v, "time_to_first_step_from_script_start_s"),
            "samples_s": [x.get("time_to_first_step_s") for x in v],
            "errors": [x["error"] for x in v if "error" in x],
            "startup": {key: median_of([x.get("engine", {}) for x in v], key)
                        for key in sorted({k2 for x in v for k2 in x.get("engine", {})
                                           if k2.startswith("summary.startup.")})},
            "runs": v}
        for k, v in runs.items()}


# ================================================================================================
# Tables
# ================================================================================================
def _num(x, fmt: str = ",.0f") -> str:
    return "–" if x is None else format(x, fmt)


def child_values(results: dict, key: str = "loadavg_1m") -> list:
    """One figure recorded at every child's launch: by default the 1-minute load average."""
    values = []
    for section in ("training", "consumption", "time_to_first_step"):
        stack = [results.get(section, {})]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                if item.get(key) is not None:
                    values.append(item[key])
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return values


def load_range(results: dict) -> str:
    loads = child_values(results)
    text = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "–"
    idle = child_values(results, "cpu_idle_before_launch")
    if idle:
        text += (f"; CPU idle over the second before each launch {min(idle):.0%}–"
                 f"{max(idle):.0%}")
    return text


def busy_warning(results: dict):
    """A warning when some child started on a machine busier than its cores."""
    loads = child_values(results)
    cores = results["machine"]["nproc"] or 1
    if not loads or max(loads) <= cores:
        return None
    busy = sum(1 for x in loads if x > cores)
    return (f"Warning: {busy} of {len(loads)} processes started with a load average above the "
            f"{cores} cores (up to {max(loads):.1f}). Eager PyTorch's OpenMP threads wait for "
            "each other at every op, so its steps slow down many times over when the cores are "
            "oversubscribed: these figures do not represent the machine. Re-run when it is idle "
            "(--wait-for-load).")


def markdown(results: dict) -> str:
    """The results as docs/performance.md's generated block."""
    m = results["machine"]
    commit = (results["git"]["commit"] or "?")[:7]
    lines = [
        f"Run of {results['date'][:10]} at commit `{commit}` on {m.get('cpu', 'an unnamed CPU')}"
        + (f" (ATen CPU capability `{m['cpu_capability']}`)" if m.get("cpu_capability") else "")
        + f", {m['nproc']} cores, "
        f"{m['memory_gib']} GiB, torch {m['torch']}, ray {m['ray']}; "
        + (f"medians of {results['rounds']} interleaved rounds" if results["rounds"] > 1
           else "1 round") + f"{' (--quick: a smoke run)' if results['quick'] else ''}"
        + "".join(f" ({section}: {n} round{'s' if n > 1 else ''})" for section, n in
                  results.get("sections_rounds", {}).items() if n != results["rounds"])
        + "; "
        f"CSX default compiler: `{results.get('default_compiler')}`; 1-minute load average "
        f"at the children's launches {load_range(results)} (this machine is shared).",
        "",
    ]
    warning = busy_warning(results)
    if warning:
        lines += [f"**{warning}**", ""]
    training = results.get("training", {})
    for cname, title in (("with_closure", "a step closure reading the loss every step"),
                         ("without_closure", "no step closure")):
        if not training:
            break
        lines += [f"Steady-state steps/s, {title} (ratio to eager in the same run):", "",
                  "| model | " + " | ".join(VARIANT_LABELS[v] for v in SHOWN_VARIANTS) + " |",
                  "| --- " * (len(SHOWN_VARIANTS) + 1) + "|"]
        for model, entry in training.items():
            cells = []
            for v in SHOWN_VARIANTS:
                e = entry[cname][v]
                cell = _num(e["steps_per_s"])
                if v != "eager" and e["ratio_vs_eager"] is not None:
                    cell += f" ({e['ratio_vs_eager']:.2f}×)"
                if e.get("steps_per_s_after_switch"):
                    cell += f"; {_num(e['steps_per_s_after_switch'])} after the inductor switch"
                trial = trial_figures(e["runs"]) if v != "eager" else None
                if trial:
                    cell += (f"; trial: fx {trial['fx_ms']:.3g} ms, inductor "
                             f"{trial['inductor_ms']:.3g} ms a step, chose "
                             f"{' / '.join(trial['chosen'])}")
                cells.append(cell)
            lines.append(f"| {MODEL_LABELS[model]} | " + " | ".join(cells) + " |")
        lines.append("")
    first = training.get("mlp_784_512_512_10_b64", {}).get("with_closure", {})
    compute = {v: first[v].get("wafer_compute_ms_median") for v in SHOWN_VARIANTS[1:] if v in first}
    if any(x is not None for x in compute.values()):
        eager = first["eager"]["steps_per_s"]
        lines += ["The wafer's own `compute_s` per step for the MLP 784-512-512-10 (median, closure "
                  "every step): " + ", ".join(f"{VARIANT_LABELS[v]} {x:.2f} ms"
                                              for v, x in compute.items() if x is not None)
                  + (f"; eager's whole step: {1e3 / eager:.2f} ms" if eager else "") + ".", ""]
    consumption = results.get("consumption")
    if consumption:
        c = {k: v["batches_per_s"] for k, v in consumption.items()}
        lines += ["No model, ready 16×16 float batches, 2 input workers: the wafer consumes "
                  f"{_num(c['csx_ray'])} batches/s on the Ray path, {_num(c['csx_in_process'])} "
                  f"in-process; torch's DataLoader yields {_num(c['torch_dataloader_0'])} "
                  f"(`num_workers=0`) and {_num(c['torch_dataloader_2'])} (`num_workers=2`).", ""]
    startup = results.get("time_to_first_step")
    if startup:
        def ray_part(v: dict) -> str:
            ray_s = (v.get("startup") or {}).get("summary.startup.ray_start_s")
            return f" (Ray's start {ray_s:.1f} s)" if isinstance(ray_s, (int, float)) else ""
        lines += ["Time from launching the script to the first step closure (MLP 784-512-512-10, "
                  "embedded Ray, 2 input workers; medians, Ray's start the median of its own): "
                  + ", ".join(f"{k} {_num(v['time_to_first_step_s'], '.1f')} s{ray_part(v)}"
                              for k, v in startup.items()) + ".", ""]
        parts = startup.get("fx cold", {}).get("startup", {})
        if parts:
            lines += ["Its parts, fx cold (the run summary's `startup`): " + ", ".join(
                f"`{k.rsplit('.', 1)[1]}` {v:.2f} s" for k, v in parts.items()
                if isinstance(v, (int, float)) and k.endswith("_s")) + ".", ""]
    return "\n".join(lines).rstrip() + "\n"


def print_tables(results: dict) -> None:
    print(f"load average (1 min) at the children's launches: {load_range(results)}")
    warning = busy_warning(results)
    if warning:
        print(warning)
    training = results.get("training", {})
    for cname in ("with_closure", "without_closure"):
        if not training:
            break
        print(f"\nsteady-state steps/s, {cname.replace('_', ' ')} (ratio to eager):")
        print(f"{'model':32s}" + "".join(f"{v:>26s}" for v in SHOWN_VARIANTS))
        for model, entry in training.items():
            row = f"{model:32s}"
            for v in SHOWN_VARIANTS:
                e = entry[cname][v]
                cell = _num(e["steps_per_s"], ",.1f")
                if v != "eager" and e["ratio_vs_eager"] is not None:
                    cell += f" ({e['ratio_vs_eager']:.2f}x)"
                if e["errors"]:
                    cell += f" [{len(e['errors'])} failed]"
                row += f"{cell:>26s}"
            print(row)
            for v in SHOWN_VARIANTS[1:]:
                e = entry[cname][v]
                if not e["runs"]:
                    continue
                extras = []
                if e.get("wafer_compute_ms_median") is not None:
                    extras.append(f"wafer compute {e['wafer_compute_ms_median']:.2f} ms/step")
                if e.get("wafer_steps_per_s") is not None:
                    extras.append(f"wafer {e['wafer_steps_per_s']:,.1f} steps/s")
                if e.get("tiered_switch_step") is not None:
                    extras.append(f"switch at step {e['tiered_switch_step']:.0f}")
                if e.get("steps_per_s_after_switch") is not None:
                    extras.append(f"{e['steps_per_s_after_switch']:,.1f} steps/s after it")
                trial = trial_figures(e["runs"])
                if trial:
                    extras.append(f"trial: fx {trial['fx_ms']:.3g} ms, inductor "
                                  f"{trial['inductor_ms']:.3g} ms a step ({trial['steps_each']} "
                                  f"steps each), chose {' / '.join(trial['chosen'])}")
                extras.append(f"num_threads {', '.join(e['num_threads'])}")
                print(f"{'':34s}{v}: " + "; ".join(extras))
    consumption = results.get("consumption")
    if consumption:
        print("\nno-model consumption, ready 16x16 float batches (batches/s):")
        for v, e in consumption.items():
            extra = (f" (wafer side {e['wafer_batches_per_s']:,.0f})"
                     if e.get("wafer_batches_per_s") else "")
            print(f"  {v:22s} {_num(e['batches_per_s']):>8s}{extra}"
                  + (f" [{len(e['errors'])} failed]" if e["errors"] else ""))
    startup = results.get("time_to_first_step")
    if startup:
        print("\ntime to first step closure (s), from launch / from the script's first line:")
        for k, e in startup.items():
            print(f"  {k:28s} {_num(e['time_to_first_step_s'], '.2f'):>6s} / "
                  f"{_num(e['from_script_start_s'], '.2f'):>6s}"
                  + (f" [{len(e['errors'])} failed]" if e["errors"] else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved rounds (medians); default 3, with --quick 1")
    p.add_argument("--quick", action="store_true",
                   help="short runs, without a closure only eager and the CSX default, no "
                   "inductor start-up measurement; 1 round unless --rounds says otherwise")
    p.add_argument("--models", default=",".join(MODEL_LABELS),
                   help="comma-separated subset of " + ", ".join(MODEL_LABELS))
    p.add_argument("--sections", default="training,consumption,startup",
                   help="comma-separated subset of training, consumption, startup")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per child process")
    p.add_argument("--wait-for-load", type=float, default=None, metavar="LOAD",
                   help="before each child, wait (up to 2 minutes) until the 1-minute load "
                   "average is at most LOAD and the CPU was at least 90%% idle over the last "
                   "second: on a shared machine, e.g. 1.5 on 2 cores")
    p.add_argument("--docs", action="store_true",
                   help="rewrite docs/performance.md's generated block from this run")
    p.add_argument("--out", default=str(HERE / "results" / "train_throughput.json"))
    p.add_argument("--render", action="store_true",
                   help="measure nothing: print the tables of the results in --out (and with "
                   "--docs rewrite docs/performance.md's block from them)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return
    if args.render:
        results = json.loads(Path(args.out).read_text())
        print_tables(results)
        if args.docs:
            update_block(DOCS_BLOCK, markdown(results))
            print("rewrote the generated block of docs/performance.md")
        return
    LOAD_GATE["max_load"] = args.wait_for_load
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}.")
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in MODEL_LABELS]
    if unknown:
        p.error(f"--models: unknown {unknown}; choose from {', '.join(MODEL_LABELS)}.")
    sections = [s for s in args.sections.split(",") if s]
    bad = [s for s in sections if s not in ("training", "consumption", "startup")]
    if bad:
        p.error(f"--sections: unknown {bad}; choose from training, consumption, startup.")
    results = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": describe(), "git": revision(), "rounds": args.rounds,
               "quick": args.quick, "default_compiler": default_compiler(),
               "steady_window": [STEADY_FROM, STEADY_TO], "loadavg_start": os.getloadavg()}
    tmp = Path(tempfile.mkdtemp(prefix="cstream-train-throughput-"))
    try:
        if "training" in sections:
            run_training(args, tmp, results)
        if "consumption" in sections:
            run_consumption(args, tmp, results)
        if "startup" in sections:
            run_startup(args, tmp, results)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["loadavg_end"] = os.getloadavg()
    results["markdown"] = markdown(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print_tables(results)
    print(f"\nwrote {out}")
    if args.docs:
        update_block(DOCS_BLOCK, results["markdown"])
        print("rewrote the generated block of docs/performance.md")


if __name__ == "__main__":
    main()
