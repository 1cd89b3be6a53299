"""Everything that runs on a CUDA GPU, checked in one go (under 5 minutes on one GPU).

Three parts, each a table; the whole passes when every row passes:

1. **The examples** (examples/train.py, then examples/evaluate.py on its last checkpoint), each
   in its own process as a user runs them: on the CPU backend (the reference), on
   ``--backend GPU``, and on ``--backend CSX --device cuda`` in this process and, where Ray is
   importable, on Ray. A row passes when its evaluation accuracy is within 1% of the CPU
   backend's (300 float32 SGD steps on other hardware round differently and may flip a
   prediction near the boundary) and the reference reaches 95%.
2. **The model set** the suite trains on CSX (tests/test_model_zoo.py, tests/test_seed_models.py):
   an MLP, a ResNet-style CNN with batch norm, a dropout MLP, a small GPT-style LM with causal
   ``scaled_dot_product_attention``, transformers' GPT-2, BERT (masked LM) and Llama in tiny
   configs, bf16 autocast, and GPT-2 with right-padded masks and ``clip_grad_norm_``; 10 steps
   each on the CSX wafer on CUDA (in this process) against the GPU backend. fp32 rows compare
   every loss and every weight within a relative 1e-4 (absolute 1e-5 near 0): the same float32
   arithmetic in kernels chosen separately for the eager and the replayed step, amplified over
   10 Adam steps; bf16 rows within 2**-6 (bfloat16 keeps 8 significant bits). The dropout row
   checks that both train: the wafer's CUDA generator is seeded from the client's CPU generator,
   the GPU backend's is torch's CUDA generator, so their masks differ (docs/wafer.md).
3. **The CUDA tests**: ``pytest -m "cuda and not slow"`` over the test files that hold tests
   marked ``cuda`` (the examples' slow CUDA test is part 1 here).

Writes ``benchmarks/results/gpu_check.json`` (``--device cpu``: ``gpu_check_cpu.json``) and
prints the tables.

    python -m benchmarks.gpu_check                # on a machine with a CUDA GPU
    python -m benchmarks.gpu_check --device cpu   # the dry run: the CPU backend is the
                                                  # reference and the wafer runs on the CPU

``--ray no`` leaves out the Ray rows (for a machine without Ray: ``pip install ray``, or put a
copy of Ray's package on ``PYTHONPATH``); ``--ray auto`` (the default) runs them where
``import ray`` works.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

import cstream as cstorch  # noqa: E402
from benchmarks.machine import describe, revision  # noqa: E402
from cstream_tools.models import TinyLM  # noqa: E402

TIME_LIMIT_S = 300
EXAMPLE_ACCURACY_TOL = 0.01  # 1% of the test set (module docstring)
FP32_REL, FP32_ABS = 1e-4, 1e-5
BF16_REL = 2.0 ** -6
VOCAB, SEQ, BATCH, STEPS = 64, 16, 4, 10  # VOCAB, SEQ: the sizes TinyLM() is built with


# -- 1. the examples ----------------------------------------------------------------------------------

def run_example(script: str, args: list, cwd: Path, timeout_s: int = 240) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=cwd,
                         env=env, capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(args)} exited with {out.returncode}:\n"
                           f"{(out.stdout + out.stderr)[-3000:]}")
    return out.stdout


def example_row(name: str, backend_args: list, workdir: Path) -> dict:
    run_dir = workdir / name
    t0 = time.perf_counter()
    try:
        train = run_example("train.py", [*backend_args, "--artifact-dir", str(run_dir),
                                         "--log-every", "100"], workdir)
        t_train = time.perf_counter() - t0
        evaluated = run_example("evaluate.py", [*backend_args, "--artifact-dir", str(run_dir),
                                                "--checkpoint-dir", str(run_dir / "checkpoints")],
                                workdir)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return {"variant": name, "args": " ".join(backend_args), "error": str(e)[-1500:],
                "wall_s": round(time.perf_counter() - t0, 1)}
    losses = [float(m) for m in re.findall(r"loss ([0-9.]+)", train)]
    accuracy = float(re.search(r"Eval Accuracy: ([0-9.]+)", evaluated).group(1))
    return {"variant": name, "args": " ".join(backend_args), "final_train_loss": losses[-1],
            "eval_accuracy": accuracy, "train_s": round(t_train, 1),
            "wall_s": round(time.perf_counter() - t0, 1)}


def check_examples(device: str, use_ray: bool, workdir: Path) -> list:
    variants = [("cpu_backend", ["--backend", "CPU"])]
    if device == "cuda":
        variants.append(("gpu_backend", ["--backend", "GPU"]))
    variants.append((f"csx_{device}_in_process",
                     ["--backend", "CSX", "--device", device, "--in-process"]))
    if use_ray:
        variants.append((f"csx_{device}_ray", ["--backend", "CSX", "--device", device]))
    rows = [example_row(name, args, workdir) for name, args in variants]
    reference = rows[0].get("eval_accuracy")
    for row in rows:
        if "error" in row or reference is None:
            row["ok"] = False
            continue
        row["accuracy_diff"] = round(row["eval_accuracy"] - reference, 4)
        row["ok"] = reference >= 0.95 and abs(row["accuracy_diff"]) <= EXAMPLE_ACCURACY_TOL
    return rows


# -- 2. the model set -----------------------------------------------------------------------------------

class MLP(torch.nn.Module):
    def __init__(self, outputs=1, dropout=0.0):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.GELU(),
                                       torch.nn.Dropout(dropout), torch.nn.LayerNorm(64),
                                       torch.nn.Linear(64, outputs))

    def forward(self, x):
        return self.net(x)


class ResNet(torch.nn.Module):
    """A stem and two residual blocks with BatchNorm2d, global pooling, a classifier."""

    def __init__(self, classes=5):
        super().__init__()

        def block(cin, cout, stride):
            return torch.nn.ModuleDict({
                "a": torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                                         torch.nn.BatchNorm2d(cout), torch.nn.ReLU(),
                                         torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                         torch.nn.BatchNorm2d(cout)),
                "skip": torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            torch.nn.BatchNorm2d(cout))})

        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(8), torch.nn.ReLU())
        self.blocks = torch.nn.ModuleList([block(8, 8, 1), block(8, 16, 2)])
        self.fc = torch.nn.Linear(16, classes)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = torch.relu(b["a"](x) + b["skip"](x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def vectors(n=STEPS, outputs=None):
    g = torch.Generator().manual_seed(3)
    if outputs is None:
        return [(torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 1, generator=g))
                for _ in range(n)]
    return [(torch.randn(BATCH, 8, generator=g), torch.randint(0, outputs, (BATCH,), generator=g))
            for _ in range(n)]


def images(n=STEPS):
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 5, (8,), generator=g))
            for _ in range(n)]


def tokens(n=STEPS):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(n)]


def masked_tokens(n=STEPS):
    """15% of the tokens replaced by [MASK] (id 3) and predicted."""
    out = []
    for i, ids in enumerate(tokens(n)):
        chosen = torch.rand(ids.shape, generator=torch.Generator().manual_seed(i)) < 0.15
        out.append({"input_ids": torch.where(chosen, torch.full_like(ids, 3), ids),
                    "labels": torch.where(chosen, ids, torch.full_like(ids, -100))})
    return out


def padded_tokens(n=STEPS):
    """Right padding (id 0, attention_mask 0, label -100) in two rows of each batch."""
    out = []
    for ids in tokens(n):
        mask = torch.ones_like(ids)
        mask[1, SEQ - 4:] = 0
        mask[3, SEQ - 7:] = 0
        out.append({"input_ids": torch.where(mask.bool(), ids, 0), "attention_mask": mask,
                    "labels": torch.where(mask.bool(), ids, -100)})
    return out


def mse(compiled, batch):
    x, y = batch
    return ((compiled(x) - y) ** 2).mean()


def cross_entropy(compiled, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(compiled(x), y)


def lm(compiled, ids):
    logits = compiled(ids)
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                                             ids[:, 1:].reshape(-1))


def hf_lm(compiled, ids):
    return compiled(input_ids=ids, labels=ids).loss


def hf_kwargs(compiled, batch):
    return compiled(**batch).loss


def bf16(compiled, batch):
    x, y = batch
    with torch.autocast(x.device.type, dtype=torch.bfloat16):  # the device the step runs on
        out = compiled(x)
    return ((out.float() - y) ** 2).mean()


def _hf(name: str):
    def build():
        import transformers

        transformers.logging.set_verbosity_error()
        small = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=0)
        if name == "gpt2":
            return transformers.GPT2LMHeadModel(transformers.GPT2Config(
                n_positions=SEQ, n_embd=32, n_layer=2, n_head=4, **small))
        if name == "bert":
            return transformers.BertForMaskedLM(transformers.BertConfig(
                vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=SEQ, pad_token_id=0))
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=SEQ, pad_token_id=0, **small))
    return build


@dataclass
class Case:
    build: Callable[[], torch.nn.Module]
    input_fn: Callable
    loss: Callable
    adam: bool = True
    clip: Optional[float] = None  # torch.nn.utils.clip_grad_norm_ in the step
    bf16: bool = False
    dropout: bool = False  # the wafer's masks differ from the GPU backend's (module docstring)
    needs: Optional[str] = None  # a package the case imports


MODELS = {
    "mlp": Case(MLP, vectors, mse),
    "cnn_batchnorm": Case(ResNet, images, cross_entropy, adam=False),
    "dropout_mlp": Case(lambda: MLP(dropout=0.5), vectors, mse, dropout=True),
    "gpt_lm_sdpa_causal": Case(TinyLM, tokens, lm),
    "hf_gpt2": Case(_hf("gpt2"), tokens, hf_lm, needs="transformers"),
    "hf_bert_mlm": Case(_hf("bert"), masked_tokens, hf_kwargs, needs="transformers"),
    "hf_llama": Case(_hf("llama"), tokens, hf_lm, needs="transformers"),
    "bf16_autocast": Case(MLP, vectors, bf16, bf16=True),
    "hf_gpt2_padded_clipped": Case(_hf("gpt2"), padded_tokens, hf_kwargs, clip=0.5,
                                   needs="transformers"),
}


def train(case: Case, kind: str, options: dict, artifact_dir: Path):
    """Losses and final weights (on the CPU) of STEPS steps of ``case`` on a fresh backend."""
    torch.manual_seed(0)
    backend = cstorch.backend(kind, artifact_dir=artifact_dir, **options)
    try:
        model = case.build()
        compiled = cstorch.compile(model, backend)
        opt = cstorch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01) if case.adam \
            else cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        @cstorch.trace
        def step(batch):
            loss = case.loss(compiled, batch)
            loss.backward()
            if case.clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), case.clip)
            opt.step()
            opt.zero_grad()
            return loss

        losses = []

        @cstorch.step_closure
        def keep(loss):
            losses.append(loss.item())

        batches = case.input_fn()
        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(lambda: batches), num_steps=len(batches))
        for batch in executor:
            keep(step(batch))
        weights = {k: v.detach().to("cpu").float().clone() for k, v in model.state_dict().items()
                   if v.is_floating_point()}
        return losses, weights
    finally:
        backend.shutdown()


def rel_diff(a: float, b: float, floor: float) -> float:
    return abs(a - b) / max(abs(b), floor)


def model_row(name: str, case: Case, device: str, workdir: Path) -> dict:
    row = {"model": name}
    if case.needs and importlib.util.find_spec(case.needs) is None:
        return {**row, "ok": False, "error": f"{case.needs} is not installed"}
    reference = ("GPU", {}) if device == "cuda" else ("CPU", {})
    wafer = ("CSX", {"device": device, "in_process": True, "compiler": "fx"})
    t0 = time.perf_counter()
    try:
        ref_losses, ref_weights = train(case, *reference, workdir / f"{name}_ref")
        t_ref = time.perf_counter() - t0
        losses, weights = train(case, *wafer, workdir / f"{name}_csx")
    except Exception as e:  # a row per model: one failing model does not hide the others
        return {**row, "ok": False, "error": f"{type(e).__name__}: {' '.join(str(e).split())}"[:1500],
                "wall_s": round(time.perf_counter() - t0, 1)}
    t_csx = time.perf_counter() - t0 - t_ref
    rel = BF16_REL if case.bf16 else FP32_REL
    floor = FP32_ABS / rel
    loss_diff = max(rel_diff(a, b, floor) for a, b in zip(losses, ref_losses))
    weight_diff = max(float(((weights[k] - w).abs() / w.abs().clamp(min=floor)).max())
                      for k, w in ref_weights.items())
    finite = all(math.isfinite(v) for v in losses + ref_losses)
    trains = len(set(losses)) > 1 and len(losses) == len(ref_losses) == STEPS
    masks_differ = case.dropout and device == "cuda"
    ok = finite and trains and (masks_differ or (loss_diff <= rel and weight_diff <= rel))
    return {**row, "ok": ok, "steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1],
            "max_rel_loss_diff": loss_diff, "max_rel_weight_diff": weight_diff, "tolerance": rel,
            "compared": "trains (masks differ by design)" if masks_differ else "losses, weights",
            "reference_s": round(t_ref, 1), "csx_s": round(t_csx, 1)}


# -- 3. the CUDA tests ------------------------------------------------------------------------------------

def check_cuda_tests() -> dict:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if "mark.cuda" in p.read_text())
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda and not slow",
                          "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True,
                         text=True, timeout=240)
    tail = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)",
                                               tail)}
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    return {"files": files, "summary": tail, "counts": counts, "returncode": out.returncode,
            "ok": out.returncode in (0, 5) and failed == 0,  # 5: every test deselected
            "wall_s": round(time.perf_counter() - t0, 1),
            "failures": out.stdout[-4000:] if failed else ""}


# -- the report ----------------------------------------------------------------------------------------------

def table(rows: list, columns: list) -> str:
    def cell(row, c):
        v = row.get(c, "")
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e-2 and v != 0 else f"{v:.4f}".rstrip("0").rstrip(".")
        return "error: " + v.splitlines()[0][:90] if c == "error" and v else str(v)
    cells = [[cell(r, c) for c in columns] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda: the check; cpu: the dry run of the same comparisons on the CPU")
    p.add_argument("--ray", choices=["auto", "yes", "no"], default="auto",
                   help="CSX rows on Ray as well (auto: where `import ray` works)")
    p.add_argument("--parts", default="examples,models,tests",
                   help="comma-separated: examples, models, tests")
    p.add_argument("--out", default=None, help="the JSON file (default benchmarks/results/"
                                               "gpu_check.json, gpu_check_cpu.json with --device cpu)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda: torch.cuda.is_available() is False here (torch "
                f"{torch.__version__}); run the dry run with --device cpu.")
    has_ray = importlib.util.find_spec("ray") is not None
    if args.ray == "yes" and not has_ray:
        p.error("--ray yes: Ray is not importable here; install it (pip install ray) or use "
                "--ray no.")
    use_ray = has_ray and args.ray != "no"
    parts = {s.strip() for s in args.parts.split(",") if s.strip()}
    unknown = parts - {"examples", "models", "tests"}
    if unknown:
        p.error(f"--parts: unknown {sorted(unknown)}; choose from examples, models, tests.")
    out_path = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / (
        "gpu_check.json" if args.device == "cuda" else "gpu_check_cpu.json")

    t0 = time.perf_counter()
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": args.device, "dry_run": args.device == "cpu", "ray": use_ray,
              "machine": describe(args.device), "git": revision()}
    print(f"gpu_check on {result['machine'].get('gpu', 'the CPU (dry run)')}, torch "
          f"{torch.__version__}, Ray rows: {'yes' if use_ray else 'no'}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        workdir = Path(tmp)
        if "examples" in parts:
            result["examples"] = check_examples(args.device, use_ray, workdir)
            print("\n1. examples: train.py, then evaluate.py (accuracy against the CPU backend)")
            print(table(result["examples"], ["variant", "eval_accuracy", "accuracy_diff",
                                             "final_train_loss", "wall_s", "ok", "error"]),
                  flush=True)
        if "models" in parts:
            result["models"] = [model_row(n, c, args.device, workdir) for n, c in MODELS.items()]
            ref = "GPU backend" if args.device == "cuda" else "CPU backend"
            print(f"\n2. models: CSX device={args.device!r} (in this process) against the {ref}, "
                  f"{STEPS} steps")
            print(table(result["models"], ["model", "compared", "max_rel_loss_diff",
                                           "max_rel_weight_diff", "tolerance", "last_loss",
                                           "csx_s", "ok", "error"]), flush=True)
    if "tests" in parts:
        result["cuda_tests"] = check_cuda_tests()
        t = result["cuda_tests"]
        print(f"\n3. CUDA tests ({', '.join(t['files'])}): {t['summary']}  ok={t['ok']}")
        if t["failures"]:
            print(t["failures"])
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["under_time_limit"] = result["wall_s"] <= TIME_LIMIT_S
    result["ok"] = all(r["ok"] for r in result.get("examples", []) + result.get("models", [])) \
        and result.get("cuda_tests", {}).get("ok", True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{'PASS' if result['ok'] else 'FAIL'}: {result['wall_s']} s "
          f"({'within' if result['under_time_limit'] else 'over'} the {TIME_LIMIT_S} s budget); "
          f"wrote {out_path}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
