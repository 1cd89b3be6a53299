"""Checkpoint files both ways between the real ``cerebras.pytorch`` and cstream.

Run under the real package (``cd tests && /work/cbref/bin/python -m reference.generate
gen_ckpt``); it never imports cstream. It writes into ``fixtures/``:

* ``ckpt_real_state.h5`` + ``.json``: ``cerebras.pytorch.save`` of nested dicts, lists, tuples,
  numbers, strings, ``None``, bfloat16 / float16 / integer / bool tensors, tied tensors and pickled
  values (bytes, a dtype, a complex), and the record (:mod:`records`) of what was saved;
* ``ckpt_real_train.h5`` + ``.json``: a model and its (plain) SGD state after 3 steps of a run on
  the real CPU backend, and the record of the uninterrupted run: every loss and the weights after 6
  steps, so a test can resume from the file in cstream and compare the 3 further steps;
* ``ckpt_real_adam_sched.h5`` + ``.json``: model, Adam and LinearLR state dicts after 3 steps (the
  scheduler's and optimizer's tensors included), and their record;
* ``ckpt_legacy_0_4.h5`` + ``.json``: a file in the layout of ``cerebras.pytorch`` 2.0 (``__version__``
  0.4: a ``dill``-pickled tree spec, percent-encoded dataset names with ``__H5_TYPE__``). 2.10.0
  can no longer write it, so it is built here with ``dill`` and h5py as its legacy reader
  (``cerebras.pytorch.storage._legacy``) expects, and that reader (``cerebras.pytorch.load``) must
  read it back to the recorded values;
* ``ckpt_cstream_read_by_real.json``: what ``cerebras.pytorch.load`` read from the cstream-written
  ``cstream_written/cstream_state.h5`` (LZ4-compressed) and ``cstream_state_uncompressed.h5`` (for
  each its record, and the SHA-256 of the file it read), which the suite compares with what cstream
  saved there.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import pathlib

import torch
from reference.realpkg import cpu_backend
from reference.records import record

import cerebras.pytorch as cstorch

HERE = pathlib.Path(__file__).resolve().parent


def _write(out: pathlib.Path, name: str, data) -> None:
    (out / name).write_text(json.dumps(data, indent=1) + "\n")
    print(f"  wrote {out / name}")


def real_state() -> dict:
    w = (torch.arange(6, dtype=torch.float32).reshape(2, 3) - 2.5) / 3
    return {
        "model": collections.OrderedDict([("fc.weight", w), ("fc.bias", torch.tensor([0.5, -1.5])),
                                          ("bn.num_batches_tracked", torch.tensor(4)),
                                          ("decoder.weight", w)]),  # tied: a LinkedObject
        "optimizer": {"state": {0: {"momentum_buffer": w * 0.1}, 1: {}},
                      "param_groups": [{"lr": 0.1, "momentum": 0.9, "nesterov": False,
                                        "foreach": None, "params": [0, 1]}]},
        "tensors": {"bf16": torch.tensor([1.0, -0.0, math.inf, -3.140625], dtype=torch.bfloat16),
                    "fp16": torch.tensor([[65504.0, -2.0 ** -24], [math.nan, 0.1]],
                                         dtype=torch.float16),
                    "int64": torch.tensor([-(2 ** 63), 2 ** 63 - 1]),
                    "int32": torch.arange(-3, 3, dtype=torch.int32),
                    "uint8": torch.arange(250, 256, dtype=torch.uint8),
                    "bool": torch.tensor([True, False, True]),
                    "scalar": torch.tensor(0.125, dtype=torch.float16),
                    "big": torch.linspace(-1, 1, 3000).reshape(30, 100),  # LZ4: one chunk
                    "chunks": (torch.arange(4500, dtype=torch.int32) % 977).reshape(45, 100)},
        "plain": {"step": 3, "big": 2 ** 70, "ratio": -0.0, "text": "héllo", "none": None,
                  "flag": False, "nested": [1, (2.5, "x"), [], {}, ()], 7: "int key"},
        "pickled": {"bytes": b"\x00\xff", "dtype": torch.float16, "complex": 1 - 2j},
    }


def _same(a: list, b: list) -> None:
    assert a == b, next((x, y) for x, y in zip(a, b) if x != y)


def write_real_state(out: pathlib.Path) -> None:
    obj = real_state()
    path = out / "ckpt_real_state.h5"
    path.unlink(missing_ok=True)
    cstorch.save(obj, str(path))
    _same(record(cstorch.load(str(path))), record(obj))  # the real package reads back what it saved
    _write(out, "ckpt_real_state.json", {"record": record(obj)})


def _train(out: pathlib.Path, name: str, optimizer: str, steps: int, save_at: int) -> dict:
    """A small run on the real CPU backend; saves model (+ optimizer, scheduler) after `save_at`."""
    torch.manual_seed(0)
    backend = cpu_backend(cstorch)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    compiled = cstorch.compile(model, backend)
    if optimizer == "sgd":
        opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
        sched = None
    else:
        opt = cstorch.optim.Adam(model.parameters(), lr=0.01)
        sched = cstorch.optim.lr_scheduler.LinearLR(opt, initial_learning_rate=0.01,
                                                    end_learning_rate=0.001, total_iters=10)
    loss_fn = torch.nn.CrossEntropyLoss()
    path = out / name
    path.unlink(missing_ok=True)
    losses = []

    @cstorch.trace
    def step(x, y):
        loss = loss_fn(compiled(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        return loss

    @cstorch.step_closure
    def keep(loss):
        losses.append(float(loss))

    @cstorch.checkpoint_closure
    def save():
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": save_at}
        if sched is not None:
            state["scheduler"] = sched.state_dict()
        cstorch.save(state, str(path))

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(batches, steps), num_steps=steps, checkpoint_steps=save_at)
    for i, (x, y) in enumerate(executor):
        keep(step(x, y))
        if i + 1 == save_at:
            save()
    return {"losses": losses, "final_model": record(model.state_dict())}


def batches(n: int) -> list:
    """The run's data: the same in both programs (torch's CPU generator gives the same numbers)."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g))
            for _ in range(n)]


def write_training(out: pathlib.Path) -> None:
    run = _train(out, "ckpt_real_train.h5", "sgd", steps=6, save_at=3)
    saved = cstorch.load(str(out / "ckpt_real_train.h5"))
    _write(out, "ckpt_real_train.json", {**run, "record": record(saved)})
    _train(out, "ckpt_real_adam_sched.h5", "adam", steps=3, save_at=3)
    saved = cstorch.load(str(out / "ckpt_real_adam_sched.h5"))
    _write(out, "ckpt_real_adam_sched.json", {"record": record(saved)})


def legacy_state() -> dict:
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4
    return {"model": collections.OrderedDict([("fc.weight", w),
                                              ("fc.bias", torch.tensor([1.5, -2.0],
                                                                       dtype=torch.bfloat16))]),
            "optimizer": {"state": {0: {"step": torch.tensor(2.0)}},
                          "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0]}]},
            "step": 2, "name": "fc", "none": None, "ids": [torch.tensor([1, 2]), 2.5],
            "pickled": b"\x01\x02"}


def _legacy_dataset(f, name: str, value) -> None:
    import dill
    import h5py

    if isinstance(value, torch.Tensor):
        bf16 = value.dtype == torch.bfloat16
        ds = f.create_dataset(name, data=(value.view(torch.int16) if bf16 else value).numpy())
        ds.attrs["__H5_TYPE__"] = "TorchTensorH5Type"
        if bf16:
            ds.attrs["is_bfloat16"] = True
    elif isinstance(value, (bool, int, float)):
        f.create_dataset(name, data=value).attrs["__H5_TYPE__"] = "ScalarH5Type"
    else:
        ds = f.create_dataset(name, data=h5py.Empty("f"))
        if isinstance(value, str):
            ds.attrs.update({"__H5_TYPE__": "StringH5Type", "string_value": value})
        elif value is None:
            ds.attrs["__H5_TYPE__"] = "NoneH5Type"
        else:
            ds.attrs.update({"__H5_TYPE__": "ObjectH5Type", "object_value": dill.dumps(value).hex()})


def write_legacy(out: pathlib.Path) -> None:
    import dill
    import h5py
    from urllib.parse import quote

    from cerebras.pytorch.utils.nest import recurse_spec

    obj = legacy_state()
    flat, spec = torch.utils._pytree.tree_flatten(obj)
    path = out / "ckpt_legacy_0_4.h5"
    with h5py.File(path, "w") as f:
        f.attrs["__spec__"] = dill.dumps(spec).hex()
        f.attrs["__version__"] = 0.4
        f.attrs["__cstorch_version__"] = "2.0.3"
        for scope, value in zip(recurse_spec(spec), flat):
            _legacy_dataset(f, quote(".".join(scope), safe=""), value)
    _same(record(cstorch.load(str(path))), record(obj))  # the real legacy reader reads it so
    _write(out, "ckpt_legacy_0_4.json", {"record": record(obj)})


def read_cstream_file(out: pathlib.Path) -> None:
    def read(name: str) -> dict:
        path = HERE / "cstream_written" / name
        loaded = cstorch.load(str(path))
        return {"file": str(path.relative_to(HERE)),
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "record": record(loaded),
                "types": {"model": type(loaded["model"]).__name__,
                          "optimizer": type(loaded["optimizer"]).__name__}}

    _write(out, "ckpt_cstream_read_by_real.json", {
        "compressed": read("cstream_state.h5"), "uncompressed": read("cstream_state_uncompressed.h5")})


def main(out: pathlib.Path) -> None:
    write_real_state(out)
    write_training(out)
    write_legacy(out)
    read_cstream_file(out)
