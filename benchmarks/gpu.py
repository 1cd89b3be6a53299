"""Training speed on one CUDA GPU: cstream's GPU backend and CUDA wafer against eager PyTorch.

Three models, each trained with Adam:

* ``mlp_small``: MLP 16-64-64-4, batch 16 (launch-bound: the GPU's work per step is tiny);
* ``gpt_lm``: GPT-style LM, d256 x 4 blocks, causal attention, seq 128, batch 16;
* ``mlp_4096``: MLP 4096-4096-4096-4096, batch 1024 (16 MiB batches, each made by the loader
  sample by sample: the input-heavy case).

Variants, each run in its own process as a user runs a script (``--child``):

* ``eager``: plain PyTorch, a torch ``DataLoader`` (``num_workers=0``) over the same dataset,
  batches moved with ``.to(device)``, and ``loss.item()`` read after every step;
* ``eager_compile``: the same loop with ``torch.compile(model)``;
* ``eager_workers``: the same loop with ``DataLoader(num_workers=N, pin_memory=True)`` and
  ``non_blocking`` copies, N the input workers of the CSX variants (the fair anchor where the
  input is heavy);
* ``gpu_backend``: ``cstream.backend("GPU")``; the seed's loop (``for batch in executor:``, a
  step closure reading the loss every step);
* ``csx_in_process`` / ``csx_ray``: ``cstream.backend("CSX", device="cuda")`` in this process
  / on Ray (the default), the plain replay (``cuda_graph=False``);
* ``csx_graph_in_process`` / ``csx_graph_ray``: the same with the CUDA graph
  (``cuda_graph="auto"``, the default: ``csx_graph_ray`` is the CSX default path).

The Ray variants run only where ``import ray`` works. Variants are interleaved (every variant
of a model, then the next model; ``--rounds`` times); steps/s come from timestamps taken in the
closure (the loss read) over the steady steps (20%..95% of the run; on CSX also the wafer's own
step ends over the same steps), per variant the median of the rounds. Ratios are to eager in
the same run. Per CSX
run, the GPU-busy fraction (CUDA events, :mod:`executor.gpu_busy`) and whether the step ran as
a CUDA graph; per run, the time from launching its process to its first step.

Writes ``benchmarks/results/gpu.json`` (``--device cpu``: ``gpu_cpu.json``), prints the table
and the goals of the GPU issue, each met or not, with the measured figure.

    python -m benchmarks.gpu                      # one GPU, about 5 minutes
    python -m benchmarks.gpu --device cpu --quick # the dry run: the script's logic on the CPU
                                                  # (smaller models, the CPU backend for "GPU")
"""

from __future__ import annotations

import time

T_SCRIPT_START = time.time()  # before any import: a child's time to first step starts here

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent

# the steady window, its rate and the loss: the same as the CPU training benchmark's
from benchmarks.train_throughput import loss_fn, rate, steady_window  # noqa: E402
from benchmarks.docs_table import update_block  # noqa: E402
from benchmarks.machine import describe, label, revision  # noqa: E402

RESULT_TAG = "GPU_BENCH_RESULT "
DOCS_BLOCK = "gpu.py"  # the name of docs/performance.md's generated block

#: per model: the layer sizes (None: the LM), batch, steps of a run, input workers (N), and
#: the --quick/--device cpu dry run's smaller stand-in (same code, small enough for a CPU)
MODELS = {
    "mlp_small": {"label": "MLP 16-64-64-4, batch 16", "sizes": [16, 64, 64, 4], "batch": 16,
                  "steps": 2500, "workers": 2,
                  "dry": {"sizes": [16, 64, 64, 4], "batch": 16, "steps": 400}},
    "gpt_lm": {"label": "GPT-style LM d256 x 4, seq 128, batch 16", "sizes": None, "batch": 16,
               "lm": {"d": 256, "layers": 4, "heads": 4, "seq": 128, "vocab": 256},
               "steps": 600, "workers": 2,
               "dry": {"lm": {"d": 32, "layers": 1, "heads": 2, "seq": 16, "vocab": 64},
                       "batch": 4, "steps": 200}},
    "mlp_4096": {"label": "MLP 4096 x 3, batch 1024 (16 MiB batches)",
                 "sizes": [4096, 4096, 4096, 4096], "batch": 1024, "steps": 240, "workers": 4,
                 "generated": True,
                 "dry": {"sizes": [256, 256, 256, 256], "batch": 64, "steps": 200}},
}
VARIANTS = ["eager", "eager_compile", "eager_workers", "gpu_backend", "csx_in_process",
            "csx_graph_in_process", "csx_ray", "csx_graph_ray"]
CSX_OPTIONS = {"csx_in_process": {"in_process": True, "cuda_graph": False},
               "csx_graph_in_process": {"in_process": True, "cuda_graph": "auto"},
               "csx_ray": {"cuda_graph": False}, "csx_graph_ray": {"cuda_graph": "auto"}}
CHILD_TIMEOUT_S = 150


# ================================================================================================
# The child: one run in its own process, one JSON line on stdout
# ================================================================================================
def model_spec(name: str, dry: bool) -> dict:
    spec = dict(MODELS[name])
    if dry:
        spec.update(spec["dry"])
    return spec


def build_model(spec: dict):
    from benchmarks.bench_data import mlp

    if spec["sizes"] is None:
        from cstream_tools.models import TinyLM

        return TinyLM(**spec["lm"])
    return mlp(spec["sizes"])


class Samples:
    """The model's dataset, sample by sample (a torch map-style dataset). Precomputed for the
    small models; for ``generated`` ones each sample is made when read (seeded by its index),
    so a batch costs its loader real work, as a decoding or augmenting pipeline does."""

    def __init__(self, spec: dict, n: int):
        import torch

        self.spec, self.n = spec, n
        g = torch.Generator().manual_seed(0)
        if spec["sizes"] is None:
            lm = spec["lm"]
            tokens = torch.randint(0, lm["vocab"], (n, lm["seq"] + 1), generator=g)
            self.x, self.y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        elif not spec.get("generated"):
            self.x = torch.randn(n, spec["sizes"][0], generator=g)
            self.y = torch.randint(0, spec["sizes"][-1], (n,), generator=g)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        if not self.spec.get("generated"):
            return self.x[i], self.y[i]
        g = torch.Generator().manual_seed(i)
        return (torch.randn(self.spec["sizes"][0], generator=g),
                torch.randint(0, self.spec["sizes"][-1], (), generator=g))


def loader(spec: dict, workers: int = 0, pin: bool = False, sharded: bool = False):
    """A torch DataLoader over :class:`Samples` (256 batches an epoch); ``sharded``: its batch
    sampler is cstream's ``ShardedSampler`` (the input_fn of the CSX and GPU variants)."""
    import torch

    dataset = Samples(spec, 256 * spec["batch"])
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(dataset),
                                            batch_size=spec["batch"], drop_last=True)
    if sharded:
        import cstream as cstorch

        batches = cstorch.utils.data.ShardedSampler(batches)
    return torch.utils.data.DataLoader(dataset, batch_sampler=batches, num_workers=workers,
                                       pin_memory=pin, persistent_workers=workers > 0)


def input_fn(model: str, dry: bool):
    return loader(model_spec(model, dry), sharded=True)


def child(spec: dict) -> dict:
    import torch

    model_name, variant, dry = spec["model"], spec["variant"], spec["dry"]
    mspec = model_spec(model_name, dry)
    steps = mspec["steps"]
    device = torch.device(spec["device"])
    times, first = [], []

    def record(loss):
        loss.item()
        times.append(time.perf_counter())
        if not first:
            first.append(time.time())

    out: dict = {}
    if variant.startswith("eager"):
        torch.manual_seed(0)
        model = build_model(mspec).to(device)
        if variant == "eager_compile":
            model = torch.compile(model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        workers = mspec["workers"] if variant == "eager_workers" else 0
        data = loader(mspec, workers=workers, pin=workers > 0 and device.type == "cuda")
        non_blocking = workers > 0
        step = 0
        while step < steps:  # epochs until the steps are done, as the DataExecutor cycles
            for x, y in data:
                x = x.to(device, non_blocking=non_blocking)
                y = y.to(device, non_blocking=non_blocking)
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                record(loss)  # the loop reads the loss every step, as the seed's closure does
                step += 1
                if step == steps:
                    break
    else:
        import cstream as cstorch

        if variant == "gpu_backend":
            backend = cstorch.backend("GPU" if device.type == "cuda" else "CPU",
                                      artifact_dir=spec["artifact_dir"])
        else:
            options = dict(CSX_OPTIONS[variant])
            if device.type != "cuda":
                options["cuda_graph"] = False if options["cuda_graph"] is False else "auto"
            backend = cstorch.backend("CSX", device=spec["device"],
                                      artifact_dir=spec["artifact_dir"],
                                      compile_dir=spec["compile_dir"], **options)
        torch.manual_seed(0)
        with backend.device:
            model = build_model(mspec)
        compiled = cstorch.compile(model, backend)
        optimizer = cstorch.optim.Adam(model.parameters(), lr=1e-3)

        @cstorch.trace
        def training_step(batch):
            inputs, targets = batch
            loss = loss_fn(compiled(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        @cstorch.step_closure
        def post_training_step(loss):
            record(loss)

        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(input_fn, model_name, dry), num_steps=steps,
            cs_config=cstorch.utils.CSConfig(num_csx=1, num_workers_per_csx=mspec["workers"]))
        for batch in executor:
            post_training_step(training_step(batch))
        lo, hi = steady_window(len(times))
        ends = [r["wafer_t"] for r in executor.step_records if "wafer_t" in r]
        out["wafer_steps_per_s"] = rate(ends, lo, hi) if len(ends) == len(times) else None
        report = executor.report or {}
        compile_report = (executor.summary or {}).get("compile", {})
        graph = compile_report.get("cuda_graph") or {}
        out["engine"] = {
            "gpu_busy_fraction": report.get("gpu_busy_fraction"),
            "gpu_input_bound_fraction": report.get("gpu_input_bound_fraction"),
            "gpu_verdict": report.get("gpu_verdict"),
            "utilisation": report.get("utilisation"),
            "starved_fraction": report.get("starved_fraction"),
            "cuda_graph_recorded_at_step": graph.get("recorded_at_step"),
            "cuda_graph_replays": graph.get("replays"),
            "cuda_graph_why_not": graph.get("why_not"),
            "compiler_active": compile_report.get("active"),
            "startup": (executor.summary or {}).get("startup"),
        }
        backend.shutdown()
    lo, hi = steady_window(len(times))
    out.update(steps=len(times), window=[lo, hi], steps_per_s=rate(times, lo, hi))
    out["time_to_first_step_s"] = first[0] - spec["launch_time"] if first else None
    out["time_to_first_step_from_script_start_s"] = first[0] - T_SCRIPT_START if first else None
    return out


# ================================================================================================
# The parent: launch the children, interleaved, and gather medians
# ================================================================================================
def launch(spec: dict, timeout_s: float) -> dict:
    spec = dict(spec, launch_time=time.time())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                              capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    tail = (proc.stderr or proc.stdout)[-1500:]
    return {"error": f"exit code {proc.returncode}: {tail}"}


def ray_importable() -> bool:
    if importlib.util.find_spec("ray") is None:
        return False
    probe = subprocess.run([sys.executable, "-c", "import ray"], capture_output=True)
    return probe.returncode == 0


def summarize(runs: list) -> dict:
    ok = [r for r in runs if "error" not in r and r.get("steps_per_s")]
    out: dict = {"runs": runs, "ok_runs": len(ok)}
    if not ok:
        out["error"] = next((r["error"] for r in runs if "error" in r), "no rate measured")
        return out
    out["steps_per_s"] = statistics.median(r["steps_per_s"] for r in ok)
    firsts = [r["time_to_first_step_s"] for r in ok if r.get("time_to_first_step_s")]
    out["time_to_first_step_s"] = statistics.median(firsts) if firsts else None
    wafer = [r["wafer_steps_per_s"] for r in ok if r.get("wafer_steps_per_s")]
    out["wafer_steps_per_s"] = statistics.median(wafer) if wafer else None
    busy = [r["engine"]["gpu_busy_fraction"] for r in ok
            if (r.get("engine") or {}).get("gpu_busy_fraction") is not None]
    out["gpu_busy_fraction"] = statistics.median(busy) if busy else None
    engine = ok[-1].get("engine") or {}
    out["cuda_graph_recorded_at_step"] = engine.get("cuda_graph_recorded_at_step")
    out["cuda_graph_why_not"] = engine.get("cuda_graph_why_not")
    return out


def goals(results: dict) -> list[dict]:
    """The GPU issue's goals, each with the measured figure and met or not (None: not
    measured)."""
    models = results["models"]
    default = "csx_graph_ray" if "csx_graph_ray" in results["variants"] else \
        "csx_graph_in_process"

    def ratio(model, variant, anchor="eager"):
        m = models.get(model, {})
        a, b = m.get(anchor, {}).get("steps_per_s"), m.get(variant, {}).get("steps_per_s")
        return b / a if a and b else None

    def goal(name, value, target, fmt="{:.2f}x"):
        met = None if value is None or results["dry_run"] else value >= target
        return {"goal": name, "measured": None if value is None else fmt.format(value),
                "target": fmt.format(target), "met": met}

    out = [goal(f"MLP 16-64-64-4 b16, CSX default path ({default}) vs eager",
                ratio("mlp_small", default), 2.0),
           goal(f"GPT-style LM, CSX default path ({default}) vs eager",
                ratio("gpt_lm", default), 1.3),
           goal(f"GPT-style LM, CSX default path ({default}) vs torch.compile",
                ratio("gpt_lm", default, "eager_compile"), 1.0)]
    best = max((v for v in results["variants"] if v.startswith("csx")),
               key=lambda v: models.get("mlp_4096", {}).get(v, {}).get("steps_per_s") or 0)
    out.append(goal(f"MLP 4096 b1024, CSX ({best}) vs eager with DataLoader(num_workers=N, "
                    "pin_memory=True)", ratio("mlp_4096", best, "eager_workers"), 1.0))
    out.append(goal(f"MLP 4096 b1024, CSX ({best}) GPU busy",
                    models.get("mlp_4096", {}).get(best, {}).get("gpu_busy_fraction"), 0.95,
                    "{:.1%}"))
    for model in models:
        out.append(goal(f"GPU backend vs eager, {model}", ratio(model, "gpu_backend"), 1.0))
    warm = results.get("warm_start") or {}
    ttfs = warm.get("time_to_first_step_s")
    out.append({"goal": f"time to first step, warm compile cache ({warm.get('model')}, "
                        f"{warm.get('variant')}: the Ray path where Ray runs)",
                "measured": None if ttfs is None else f"{ttfs:.1f} s", "target": "<= 10 s",
                "met": None if ttfs is None or results["dry_run"] else ttfs <= 10.0})
    return out


def table(results: dict) -> str:
    variants = results["variants"]
    head = "| model | " + " | ".join(variants) + " |"
    lines = [head, "|" + " --- |" * (len(variants) + 1)]
    for model, per in results["models"].items():
        eager = per.get("eager", {}).get("steps_per_s")
        cells = []
        for v in variants:
            r = per.get(v, {})
            sps = r.get("steps_per_s")
            if sps is None:
                cells.append("failed" if r.get("error") else "-")
                continue
            cell = f"{sps:,.1f}" if v == "eager" else \
                (f"{sps / eager:.2f}x" if eager else f"{sps:,.1f}")
            if r.get("gpu_busy_fraction") is not None:
                cell += f" (busy {r['gpu_busy_fraction']:.0%})"
            if r.get("time_to_first_step_s") is not None:
                cell += f", {r['time_to_first_step_s']:.1f} s"
            cells.append(cell)
        lines.append(f"| {MODELS[model]['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    """The docs' block: the card, the date, the table and the goals."""
    m = results["machine"]
    commit = (results["git"]["commit"] or "?")[:7]
    lines = ["", f"Measured with `python -m benchmarks.gpu` on {label(m)} "
             f"(torch {m['torch']}, CUDA {m.get('cuda')}), {results['date']}, "
             f"commit {commit}, {results['rounds']} round(s), "
             f"{results['wall_s']:.0f} s. Eager's steps/s, the others as ratios to it; "
             "(busy) is the GPU-busy fraction from CUDA events; then the time from launching "
             "the process to the first step.", "", table(results), ""]
    lines += [f"- {g['goal']}: {g['measured'] or '-'} (goal {g['target']}): "
              f"{ {True: 'met', False: 'not met', None: 'not measured'}[g['met']] }"
              for g in results["goals"]]
    return "\n".join([*lines, ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help='"cuda" (default) or "cpu" (the dry run)')
    p.add_argument("--quick", action="store_true",
                   help="small stand-in models and few steps: checks the script, measures "
                        "nothing (torch.compile left out unless --compile)")
    p.add_argument("--compile", action="store_true", help="with --quick: keep torch.compile")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--ray", choices=("auto", "yes", "no"), default="auto")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None)
    p.add_argument("--docs", action="store_true",
                   help="write the table into docs/performance.md (not in a dry run)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(RESULT_TAG + json.dumps(child(json.loads(args.child)), default=str), flush=True)
        return 0
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here (torch.cuda.is_available() is False); run with --device cpu "
              "for the dry run.", file=sys.stderr)
        return 2
    dry = args.quick or args.device == "cpu"
    variants = [v for v in args.variants.split(",") if v]
    has_ray = args.ray == "yes" or (args.ray == "auto" and ray_importable())
    if not has_ray:
        variants = [v for v in variants if not v.endswith("_ray")]
    if args.quick and not args.compile:
        variants = [v for v in variants if v != "eager_compile"]
    models = [m for m in args.models.split(",") if m]
    t0 = time.time()
    results = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": describe(args.device), "git": revision(), "dry_run": dry,
               "rounds": args.rounds,
               "variants": variants, "models": {}}
    runs: dict = {m: {v: [] for v in variants} for m in models}
    with tempfile.TemporaryDirectory(prefix="cstream-gpu-bench-") as tmp:
        for r in range(args.rounds):
            for m in models:
                for v in variants:
                    spec = {"model": m, "variant": v, "device": args.device, "dry": dry,
                            "artifact_dir": f"{tmp}/{m}-{v}-{r}",
                            "compile_dir": f"{tmp}/compile-{m}-{v}"}  # warm after round 1
                    res = launch(spec, CHILD_TIMEOUT_S)
                    runs[m][v].append(res)
                    shown = res.get("error", "").splitlines()[-1:] if "error" in res else \
                        f"{res['steps_per_s']:,.1f} steps/s" if res.get("steps_per_s") else "-"
                    print(f"round {r + 1} {m:10s} {v:22s} {shown}", flush=True)
        # time to first step with a warm compile cache: the CSX default path again, on the
        # compile_dir its first run filled
        default = "csx_graph_ray" if "csx_graph_ray" in variants else "csx_graph_in_process"
        if default in variants and models:
            m = models[0]
            warm = launch({"model": m, "variant": default, "device": args.device, "dry": dry,
                           "artifact_dir": f"{tmp}/{m}-{default}-warm",
                           "compile_dir": f"{tmp}/compile-{m}-{default}"}, CHILD_TIMEOUT_S)
            results["warm_start"] = {"model": m, "variant": default,
                                     "time_to_first_step_s": warm.get("time_to_first_step_s"),
                                     "error": warm.get("error")}
            print(f"warm start {m:10s} {default:22s} "
                  f"{warm.get('time_to_first_step_s') or warm.get('error', '')[-200:]}")
    results["models"] = {m: {v: summarize(runs[m][v]) for v in variants} for m in models}
    results["wall_s"] = time.time() - t0
    results["goals"] = goals(results)
    out = Path(args.out) if args.out else HERE / "results" / (
        "gpu.json" if args.device.startswith("cuda") else "gpu_cpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print()
    print(f"{label(results['machine'])}, torch "
          f"{results['machine']['torch']}, {results['date']}; {results['wall_s']:.0f} s"
          + ("; DRY RUN: smaller models, figures mean nothing" if dry else ""))
    print(table(results))
    print()
    for g in results["goals"]:
        met = {True: "met", False: "NOT met", None: "not judged (dry run)" if dry
               else "not measured"}[g["met"]]
        print(f"- {g['goal']}: {g['measured'] or '-'} (goal {g['target']}): {met}")
    print(f"\nwrote {out}")
    if args.docs and not dry:
        update_block(DOCS_BLOCK, markdown(results), heading="On one GPU")
        print("updated docs/performance.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
