"""What a checkpoint step costs a training run, as a user meets it.

The seed's loop, each variant in its own process: an MLP of ``--width`` x ``--width`` layers
trained with AdamW (the state saved is the weights and both Adam moments: ``--layers`` x
``--width``^2 x 3 float32 values), a step closure reading the loss every step, and on every
``--every``-th step a checkpoint closure that saves the model's and the optimizer's state:

* ``csx``: ``cstream.backend("CSX")`` (the Ray driver actor, one input worker), the save in a
  ``@cstream.checkpoint_closure`` with ``cstream.save``: the state comes from the wafer's
  snapshot of that step, then is written;
* ``eager cstream.save`` / ``eager torch.save``: plain PyTorch, a torch DataLoader over the same
  data, the same state saved at the same steps.

``--baseline DIR`` adds ``csx at DIR``: the same run on the library checked out at ``DIR`` (a git
worktree of another revision), to compare two revisions in one interleaved run.

Each variant also runs without checkpoints. A run's seconds go from the end of its first step
(compiled by then) to the end of its last; a checkpoint's cost to the run is
``(seconds with checkpoints - seconds without) / checkpoints``; the closure's own time is
reported beside it (the wafer keeps computing while the client saves, until its output buffer
is full). Variants are interleaved over ``--rounds`` rounds; medians.

    python -m benchmarks.checkpoint_step [--width 2048] [--layers 5] [--steps 40] [--every 10]
        [--rounds 3] [--baseline DIR]

Writes ``benchmarks/results/checkpoint_step.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ["csx", "eager cstream.save", "eager torch.save"]
BATCH = 16


# -- the child: one run ---------------------------------------------------------------------------
def _data(width: int, n: int):
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(n, width, generator=g),
                                          torch.randn(n, width, generator=g))


def _model(width: int, layers: int):
    import torch

    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods[:-1])


def child_csx(spec: dict) -> dict:
    import torch

    import cstream as cstorch

    width, layers, steps, every = spec["width"], spec["layers"], spec["steps"], spec["every"]
    n = steps * BATCH

    def input_fn(batch_size):
        data = _data(width, n)
        batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(data),
                                                batch_size, drop_last=True)
        return torch.utils.data.DataLoader(
            data, batch_sampler=cstorch.utils.data.ShardedSampler(batches))

    backend = cstorch.backend("CSX", artifact_dir=spec["dir"], max_checkpoints=1)
    with backend.device:
        model = _model(width, layers)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.configure_optimizer("AdamW", model.parameters(), lr=1e-4)

    @cstorch.trace
    def training_step(batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    closures = []

    @cstorch.checkpoint_closure
    def save(step):
        t0 = time.perf_counter()
        cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "step": step}, f"{spec['dir']}/ckpt_{step}.mdl")
        closures.append(time.perf_counter() - t0)

    losses, ends = [], []

    @cstorch.step_closure
    def log(loss):
        losses.append(float(loss))
        ends.append(time.perf_counter())

    dataloader = cstorch.utils.data.DataLoader(input_fn, batch_size=BATCH)
    executor = cstorch.utils.data.DataExecutor(
        dataloader, num_steps=steps, checkpoint_steps=every if every else None,
        cs_config=cstorch.utils.CSConfig(num_csx=1, num_workers_per_csx=1))
    for step, batch in enumerate(executor, 1):
        log(training_step(batch))
        if every:
            save(step)
    backend.shutdown()
    # from the end of the first step (compiled by then) to the end of the last
    return {"seconds": ends[-1] - ends[0], "closures_s": closures, "losses": losses[-1:]}


def child_eager(spec: dict) -> dict:
    import torch

    import cstream

    width, layers, steps, every = spec["width"], spec["layers"], spec["steps"], spec["every"]
    saver = torch.save if spec["variant"] == "eager torch.save" else cstream.save
    loader = torch.utils.data.DataLoader(_data(width, steps * BATCH), batch_size=BATCH)
    model = _model(width, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    closures, losses, ends = [], [], []
    for step, (x, y) in enumerate(loader, 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if every and (step % every == 0 or step == steps):
            t1 = time.perf_counter()
            saver({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                   "step": step}, f"{spec['dir']}/ckpt_{step}.mdl")
            closures.append(time.perf_counter() - t1)
        ends.append(time.perf_counter())
    return {"seconds": ends[-1] - ends[0], "closures_s": closures, "losses": losses[-1:]}


def child_main(spec: dict) -> None:
    torch_threads = os.environ.get("CHECKPOINT_STEP_THREADS")
    if torch_threads:
        import torch

        torch.set_num_threads(int(torch_threads))
    out = child_csx(spec) if spec["variant"].startswith("csx") else child_eager(spec)
    print(json.dumps(out))


# -- the driver -----------------------------------------------------------------------------------
def launch(spec: dict, library: Path = REPO, timeout_s: float = 1200.0) -> dict:
    """One run in a process of its own, importing cstream from the checkout ``library``."""
    env = {**os.environ, "PYTHONPATH": str(library), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                           json.dumps(spec)], capture_output=True, text=True, env=env,
                          cwd=spec["dir"], timeout=timeout_s)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else
                f"exit {done.returncode}", "stderr": done.stderr[-3000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def state_mib(width: int, layers: int) -> float:
    """The weights and both AdamW moments, in MiB."""
    return 3 * layers * (width * width + width) * 4 / 2**20


def summarize(runs: dict, steps: int, every: int) -> dict:
    checkpoints = len(range(every, steps + 1, every)) + (steps % every != 0)
    table = {}
    for v in runs:
        with_ = [r["seconds"] for r in runs[v]["with"] if "seconds" in r]
        without = [r["seconds"] for r in runs[v]["without"] if "seconds" in r]
        closures = [c for r in runs[v]["with"] for c in r.get("closures_s", [])]
        if not with_ or not without:
            table[v] = None
            continue
        w, wo = statistics.median(with_), statistics.median(without)
        table[v] = {"seconds_with": w, "seconds_without": wo, "checkpoints": checkpoints,
                    "cost_per_checkpoint_s": (w - wo) / checkpoints,
                    "closure_s": statistics.median(closures) if closures else None,
                    "step_s": wo / steps}
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", help="also run the CSX variant on the library checked out here")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "checkpoint_step.json"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return
    libraries = {v: REPO for v in VARIANTS}
    if args.baseline:
        libraries[f"csx at {args.baseline}"] = Path(args.baseline).resolve()
    variants = list(libraries)
    runs = {v: {"with": [], "without": []} for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i in range(len(variants)):
                v = variants[(i + r) % len(variants)]  # the order turned by one each round
                for kind, every in (("with", args.every), ("without", 0)):
                    d = tempfile.mkdtemp(dir=tmp)
                    res = launch({"variant": v, "width": args.width, "layers": args.layers,
                                  "steps": args.steps, "every": every, "dir": d},
                                 libraries[v])
                    runs[v][kind].append(res)
                    print(f"round {r + 1} {v} {kind} checkpoints: "
                          + (f"{res['seconds']:.2f} s" if "seconds" in res else res["error"])
                          + (f", closures {[round(c, 2) for c in res['closures_s']]}"
                             if res.get("closures_s") else ""), flush=True)
    table = summarize(runs, args.steps, args.every)
    from benchmarks import machine

    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "git": machine.revision(), "machine": machine.describe(), "state_mib": state_mib(args.width,
                                                                               args.layers),
           "args": {k: v for k, v in vars(args).items() if k != "child"}, "table": table,
           "runs": runs}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"\n{state_mib(args.width, args.layers):.0f} MiB state, {args.steps} steps, a checkpoint "
          f"every {args.every}, medians of {args.rounds}:")
    width = max(len(v) for v in table) + 2
    print(f"{'variant':{width}s}{'step s':>9s}{'closure s':>11s}{'cost/ckpt s':>13s}")
    for v, c in table.items():
        if c is None:
            print(f"{v:{width}s} failed")
            continue
        print(f"{v:{width}s}{c['step_s']:9.3f}{c['closure_s'] or 0:11.2f}"
              f"{c['cost_per_checkpoint_s']:13.2f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
