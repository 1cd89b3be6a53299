"""The "Full Example (Training)" of Cerebras' porting guide, runnable: an MLP on handwritten digits.

    python examples/train.py                       # simulated wafer (CSX), 2 input workers
    python examples/train.py --backend CPU         # eager, one process
    python examples/train.py --num-csx 2 --num-workers-per-csx 2

Prints the loss from a step closure, the rate and global rate, and saves a checkpoint on
checkpoint steps only (at most --max-checkpoints are kept). TensorBoard events (the loss every
step through cstorch.summarize_scalar, rate, global_rate, the wafer's and each input worker's
figures) go to ARTIFACT_DIR/tensorboard:

    tensorboard --logdir cstream_logs/tensorboard
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# data.py beside this file, by the name a script sees it: also where the file is imported as a
# module (the tests import examples.train; input workers unpickle its data.train_input_fn)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

import cstream as cstorch  # noqa: E402
from data import MLP, train_input_fn  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="CSX", choices=["CSX", "CPU", "GPU"])
    p.add_argument("--num-csx", type=int, default=1)
    p.add_argument("--num-workers-per-csx", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)  # ~13 epochs of 1,500 images: enough for 95%+
    p.add_argument("--checkpoint-steps", type=int, default=100)
    p.add_argument("--max-checkpoints", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--artifact-dir", default="cstream_logs")
    p.add_argument("--checkpoint", default=None, help="resume from this checkpoint")
    p.add_argument("--in-process", action="store_true", help="CSX: run the wafer in this process")
    p.add_argument("--device", default="cpu",
                   help="CSX: where the wafer executes the step (cpu, cuda, cuda:N)")
    p.add_argument("--log-every", type=int, default=25)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    options = {"artifact_dir": args.artifact_dir, "max_checkpoints": args.max_checkpoints}
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
    loss_fn = torch.nn.CrossEntropyLoss()

    optimizer = cstorch.optim.configure_optimizer(
        optimizer_type="SGD", params=model.parameters(), lr=0.1, momentum=0.9,
    )
    lr_scheduler = cstorch.optim.configure_lr_scheduler(
        optimizer,
        learning_rate=[
            # a short warm-up, then cosine decay over the rest of the run
            {"scheduler": "Linear", "initial_learning_rate": 0.01,
             "end_learning_rate": 0.1, "total_iters": 20},
            {"scheduler": "CosineDecay", "initial_learning_rate": 0.1,
             "end_learning_rate": 0.001, "total_iters": max(args.steps - 20, 1)},
        ],
    )
    grad_scaler = None  # loss_scale == 0.0: float32 training needs no loss scaling

    ckpt_dir = Path(args.artifact_dir) / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)

    @cstorch.checkpoint_closure
    def save_checkpoint(step):
        checkpoint_file = ckpt_dir / f"checkpoint_{step}.h5"
        state_dict = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "lr_scheduler": lr_scheduler.state_dict(),
            "global_step": step,
        }
        cstorch.save(state_dict, checkpoint_file)
        print(f"saved {checkpoint_file}")

    global_step = 0
    if args.checkpoint is not None:
        state_dict = cstorch.load(args.checkpoint)
        model.load_state_dict(state_dict["model"])
        optimizer.load_state_dict(state_dict["optimizer"])
        lr_scheduler.load_state_dict(state_dict["lr_scheduler"])
        global_step = state_dict.get("global_step", 0)

    @cstorch.compile_step
    def training_step(batch):
        inputs, targets = batch
        outputs = compiled_model(inputs)
        loss = loss_fn(outputs, targets)
        cstorch.amp.optimizer_step(loss, optimizer, grad_scaler, max_gradient_norm=1.0)
        lr_scheduler.step()
        cstorch.summarize_scalar("loss", loss)  # to the executor's writer, every step
        return loss

    @cstorch.step_closure
    def post_training_step(loss: torch.Tensor, step: int):
        if step % args.log_every == 0 or step == 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  "
                  f"rate {executor.profiler.rate():8.1f} samples/s  "
                  f"global rate {executor.profiler.global_rate():8.1f} samples/s")

    dataloader = cstorch.utils.data.DataLoader(train_input_fn, batch_size=args.batch_size)
    writer = SummaryWriter(str(Path(args.artifact_dir) / "tensorboard"))
    executor = cstorch.utils.data.DataExecutor(
        dataloader=dataloader,
        num_steps=args.steps,
        checkpoint_steps=args.checkpoint_steps,
        cs_config=cstorch.utils.CSConfig(
            num_csx=args.num_csx, num_workers_per_csx=args.num_workers_per_csx),
        writer=writer,
    )

    for i, batch in enumerate(executor):
        loss = training_step(batch)
        post_training_step(loss, global_step + i + 1)
        # always called; only runs on checkpoint steps (and the last step)
        save_checkpoint(global_step + i + 1)

    print(f"done: {executor.num_steps} steps, global rate "
          f"{executor.profiler.global_rate():.1f} samples/s; checkpoints kept: "
          f"{sorted(p.name for p in ckpt_dir.glob('*.h5'))}")
    writer.close()
    print(f"TensorBoard: tensorboard --logdir {Path(args.artifact_dir) / 'tensorboard'}; "
          f"timeline: cstream trace {executor.run_dir}")
    backend.shutdown()


if __name__ == "__main__":
    main()
