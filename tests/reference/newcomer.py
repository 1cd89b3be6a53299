"""A newcomer's training script: runs unchanged on cerebras.pytorch (CPU) and on cstream (CSX).

    python newcomer.py --backend CPU --out DIR                  # 20 steps, checkpoint at step 10
    python newcomer.py --backend CSX --out DIR --resume CKPT    # steps 11-20 from a step-10 file
"""
import argparse
import torch
try:
    import cerebras.pytorch as cstorch
except ImportError:
    import cstream as cstorch

p = argparse.ArgumentParser()
p.add_argument("--backend", default="CPU")
p.add_argument("--out", required=True)
p.add_argument("--resume")
args = p.parse_args()
torch.manual_seed(0)
backend = cstorch.backend(args.backend, artifact_dir=args.out)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
compiled = cstorch.compile(model, backend)
opt = cstorch.optim.Adam(model.parameters(), lr=0.01)
sched = cstorch.optim.lr_scheduler.LinearLR(opt, initial_learning_rate=0.001,
                                            end_learning_rate=0.01, total_iters=5)
accuracy = cstorch.metrics.AccuracyMetric("accuracy")
start = 0
if args.resume:
    state = cstorch.load(args.resume)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    start = state["step"]


def input_fn(start):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20, 16, 8, generator=g)
    y = (x[..., :3].sum(-1) > 0).long() + (x[..., 3] > 1).long()
    return list(zip(x, y))[start:]


@cstorch.trace
def step(x, y):
    logits = compiled(x)
    loss = torch.nn.functional.cross_entropy(logits, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    lr = opt.param_groups[0]["lr"]
    sched.step()
    accuracy(labels=y, predictions=logits.argmax(-1))
    return loss, lr


@cstorch.step_closure
def show(i, loss, lr):
    print(f"step {i} loss {loss.item():.6g} lr {float(lr):.6g}")


@cstorch.checkpoint_closure
def save(i):
    cstorch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                  "scheduler": sched.state_dict(), "step": i}, f"{args.out}/step_{i}.h5")


executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn, start),
                                           num_steps=20 - start, checkpoint_steps=10 - start or 10)
for i, (x, y) in enumerate(executor, start + 1):
    loss, lr = step(x, y)
    show(i, loss, lr)
    if i == 10:
        save(i)
print(f"accuracy {float(accuracy):.6g}")
