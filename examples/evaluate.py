"""The "Full Example (Evaluation)" of Cerebras' porting guide, runnable: accuracy of a trained
checkpoint.

    python examples/evaluate.py --checkpoint-dir cstream_logs/checkpoints
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import cstream.experimental as cstorch
import cstream.experimental.metrics as metrics
from data import MLP, TEST_SIZE, eval_input_fn


def newest_checkpoint(directory: Path) -> Path:
    files = sorted(directory.glob("checkpoint_*.h5"), key=lambda p: int(p.stem.split("_")[-1]))
    if not files:
        raise SystemExit(f"error: no checkpoint_*.h5 in {directory}; run examples/train.py first")
    return files[-1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", default="CSX", choices=["CSX", "CPU", "GPU"])
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--checkpoint-dir", default="cstream_logs/checkpoints")
    p.add_argument("--num-workers-per-csx", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=99)
    p.add_argument("--artifact-dir", default="cstream_logs")
    p.add_argument("--in-process", action="store_true")
    p.add_argument("--device", default="cpu",
                   help="CSX: where the wafer executes the step (cpu, cuda, cuda:N)")
    args = p.parse_args(argv)
    checkpoint = Path(args.checkpoint) if args.checkpoint else newest_checkpoint(
        Path(args.checkpoint_dir))

    options = {"artifact_dir": args.artifact_dir}
    if args.backend == "CSX":
        options["in_process"] = args.in_process
        options["device"] = args.device
    elif args.device != "cpu":
        p.error(f"--device {args.device} is an option of --backend CSX (where its wafer runs); "
                "--backend GPU runs on cuda:0 and --backend CPU on the CPU.")
    backend = cstorch.backend(args.backend, **options)
    with backend.device:
        model = MLP()
    compiled_model = cstorch.compile(model, backend)
    compiled_model.eval()
    loss_fn = torch.nn.CrossEntropyLoss()
    accuracy = metrics.AccuracyMetric("accuracy", compute_on_system=True)

    state_dict = cstorch.load(checkpoint)
    model.load_state_dict(state_dict["model"])

    dataloader = cstorch.utils.data.DataLoader(eval_input_fn, batch_size=args.batch_size)
    executor = cstorch.utils.data.DataExecutor(
        dataloader, num_steps=TEST_SIZE // args.batch_size,
        cs_config=cstorch.utils.CSConfig(num_workers_per_csx=args.num_workers_per_csx),
    )

    @cstorch.compile_step
    def evaluation_step(batch):
        inputs, targets = batch
        outputs = compiled_model(inputs)
        loss = loss_fn(outputs, targets)
        accuracy(labels=targets.clone(), predictions=outputs.argmax(-1).int())
        return loss

    total_loss = 0.0
    total_steps = 0

    @cstorch.step_closure
    def post_eval_step(loss: torch.Tensor):
        nonlocal total_loss, total_steps
        total_loss += loss.item()
        total_steps += 1

    with torch.no_grad():
        for batch in executor:
            loss = evaluation_step(batch)
            post_eval_step(loss)

    print(f"checkpoint {checkpoint} (step {state_dict.get('global_step')})")
    print(f"Eval loss: {total_loss / total_steps:.4f}")
    eval_accuracy = float(accuracy)
    print(f"Eval Accuracy: {eval_accuracy:.4f}")
    backend.shutdown()
    return eval_accuracy


if __name__ == "__main__":
    main()
