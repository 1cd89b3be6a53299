"""Reference values of the helpers Release 2.3-2.10 of the Model Zoo import from
``cerebras.pytorch`` / ``cerebras.appliance`` (run by generate.py).

Writes ``fixtures/names.json``: the real package's answers for the checkpoint ``Schedule``,
``infer_batch_size``, ``bytes_to_human``, the parameter filters, ``get_loop_iteration_slice``,
``sparse_matmul``, ``sparse_act_matmul``, ``SmoothL1Loss``, ``benchmark_dataloader``'s counts, the
``backends`` settings tree (defaults and the errors of bad values), ``ClusterConfig``'s defaults
and ``BackendType.from_str``. Inputs are written beside the outputs, so the test feeds cstream
exactly what the real package got.
"""

from __future__ import annotations

import json
import warnings

import torch

from reference.gen_optim import f32


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the error is the value recorded
        return [type(e).__name__, str(e)]
    return None


def _schedules():
    from cerebras.pytorch.utils.data.utils import Schedule

    R = Schedule.Range
    cases = {
        "every3_of_10_last": [(0 + 2, 10, 3, True)],
        "two_ranges": [(1, 4, 2, False), (4, 11, 5, True)],
        "single": [(5, 6, 1, False)],
        "empty": [],
    }
    out = {}
    for name, ranges in cases.items():
        s = Schedule([R(*r) for r in ranges])
        targets = list(range(0, 12))
        out[name] = dict(
            ranges=ranges, items=list(s), len=len(s),
            match=[i for i in range(0, 14) if s.match(i)], start=s.start,
            final_step=s.final_step,
            next=[s.next_immediate_step(t) if s.final_step is None or t <= s.final_step else None
                  for t in targets],
            next_error=_error(lambda s=s: s.next_immediate_step(99)) if ranges else None)
    out["errors"] = {
        "negative_start": _error(lambda: R(-1, 3, 1, False)),
        "end_not_after_start": _error(lambda: R(3, 3, 1, False)),
        "zero_step": _error(lambda: R(0, 3, 0, False)),
        "include_last_not_bool": _error(lambda: R(0, 3, 1, 1)),
        "overlap": _error(lambda: Schedule([R(0, 5, 1, False), R(4, 8, 1, False)])),
        "not_a_range": _error(lambda: Schedule([3])),
    }
    return out


def _infer_batch_size():
    from cerebras.pytorch.utils.data.utils import infer_batch_size

    cases = {
        "dict": ({"x": [4, 3], "y": [4]}, None),
        "nested_list": ([[[6, 2]], ([6], [6, 1, 1])], None),
        "scalar": ({"s": []}, None),
        "matches_given": ({"x": [4, 3]}, 4),
        "differs_from_given": ({"x": [4, 3]}, 8),
        "non_uniform": ({"x": [4, 3], "y": [5]}, None),
    }
    out = {}
    for name, (shapes, given) in cases.items():
        data = _tensors(shapes)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = infer_batch_size(data, given)
        out[name] = dict(shapes=shapes, batch_size=given, result=got,
                         warnings=[str(w.message) for w in caught])
    out["no_tensors"] = dict(shapes={"a": None}, error=_error(lambda: infer_batch_size({"a": 1})))
    return out


def _tensors(shapes):
    if isinstance(shapes, dict):
        return {k: _tensors(v) for k, v in shapes.items()}
    if isinstance(shapes, tuple):
        return tuple(_tensors(v) for v in shapes)
    if isinstance(shapes, list) and all(isinstance(v, int) for v in shapes):
        return torch.zeros(shapes)
    return [_tensors(v) for v in shapes]


def _filters():
    from cerebras.pytorch.sparse.configure import default_sparse_param_filter
    from cerebras.pytorch.utils.utils import convert_glob_to_regex, make_param_filter

    names = ["fc1.weight", "fc1.bias", "encoder.layer.0.norm.weight", "lm_head.weight",
             "Embedding.weight", "decoder.fc.weight", "pe_helper.x", "a.b.c"]
    shapes = {n: ([4] if n.endswith("bias") else [4, 4]) for n in names}
    globs = {"one": "fc1.*", "list": ["*.bias", "decoder.*"], "question": "fc?.weight"}
    return dict(
        names=names, shapes=shapes,
        globs={k: [bool(make_param_filter(v)(n, torch.zeros(shapes[n]))) for n in names]
               for k, v in globs.items()},
        glob_args=globs,
        regex={g: convert_glob_to_regex(g).pattern for g in ("fc1.*", "a?b[cd]")},
        default_sparse=[default_sparse_param_filter(n, torch.zeros(shapes[n])) for n in names],
        bad_callable=_error(lambda: make_param_filter(lambda x: x)),
    )


def _units():
    from cerebras.appliance.utils.units import bytes_to_human

    nums = [0, 1, 1023, 1024, 1536, 10**6, 2**30, 5 * 2**40, 1024**2 - 1, 1024**6, -2048]
    return dict(
        nums=nums, base2=[bytes_to_human(n) for n in nums],
        base10=[bytes_to_human(n, log_base=10) for n in nums],
        fmt=bytes_to_human(2048, fmt="{value:.0f} {unit}"),
        bad_base=_error(lambda: bytes_to_human(1, log_base=3)))


def _ops():
    import cerebras.pytorch as cstorch
    from cerebras.pytorch.experimental import get_loop_iteration_slice

    g = torch.Generator().manual_seed(47)
    tokens = torch.randint(0, 50, (3, 5, 2), generator=g)
    index = torch.tensor([[4], [0], [2]])
    values = torch.randn(2, 3, 4, 5, generator=g)  # (..., M, C, N)
    indices = torch.randint(0, 6, (2, 3, 4), generator=g)  # (..., M, C) into B = 6
    weight = torch.randn(7, 6, 5, generator=g)  # (K, B, N)
    act = torch.randn(2, 3, 5, generator=g)
    mask = torch.tensor([[1, 0, 1], [0, 0, 1]])
    act_weight = torch.randn(4, 5, generator=g)
    pred = torch.randn(3, 4, generator=g) * 2
    target = torch.randn(3, 4, generator=g)
    losses = {}
    for reduction in ("mean", "sum", "none"):
        for beta in (1.0, 0.5, 0.0):
            loss = cstorch.nn.SmoothL1Loss(reduction=reduction, beta=beta)(pred, target)
            losses[f"{reduction}_{beta}"] = f32(loss)
    return dict(
        loop=dict(tokens=tokens.tolist(), index=index.tolist(),
                  out=get_loop_iteration_slice(tokens, index).tolist()),
        sparse_matmul=dict(values=f32(values), indices=indices.tolist(), weight=f32(weight),
                           out=f32(cstorch.nn.functional.sparse_matmul(values, indices, weight))),
        sparse_act_matmul=dict(value=f32(act), mask=mask.tolist(), weight=f32(act_weight),
                               out=f32(cstorch.nn.functional.sparse_act_matmul(act, mask,
                                                                               act_weight))),
        smooth_l1=dict(pred=f32(pred), target=f32(target), losses=losses),
    )


def _benchmark():
    import cerebras.pytorch as cstorch

    def input_fn():
        # 5 batches of 4 and a last one of 2: two batch structures
        data = [{"x": torch.zeros(4, 3), "y": torch.zeros(4, dtype=torch.int32)}] * 5
        return data + [{"x": torch.zeros(2, 3), "y": torch.zeros(2, dtype=torch.int32)}]

    out = {}
    for name, kw in {"two_epochs": dict(num_epochs=2, sampling_frequency=2),
                     "capped": dict(num_epochs=3, steps_per_epoch=4, sampling_frequency=0)}.items():
        m = cstorch.utils.benchmark.benchmark_dataloader(input_fn, print_metrics=False, **kw)
        out[name] = dict(
            kwargs=kw, total_steps=m.total_steps,
            epoch_steps=[e.total_steps for e in m.epoch_metrics],
            sampled=[[b.epoch_step for b in e.batch_metrics] for e in m.epoch_metrics],
            sampled_global=[[b.global_step for b in e.batch_metrics] for e in m.epoch_metrics],
            specs=[[[list(t.shape) for t in spec.tensors], occ.epoch, occ.epoch_step, occ.count]
                   for spec, occ in m.batch_specs.items()],
            has_sample_rate=m.global_sample_rate is not None, is_partial=m.is_partial)
    out["errors"] = {
        "num_epochs": _error(lambda: cstorch.utils.benchmark.benchmark_dataloader(
            input_fn, num_epochs=0, print_metrics=False)),
        "steps_per_epoch": _error(lambda: cstorch.utils.benchmark.benchmark_dataloader(
            input_fn, steps_per_epoch=0, print_metrics=False)),
        "sampling_frequency": _error(lambda: cstorch.utils.benchmark.benchmark_dataloader(
            input_fn, sampling_frequency=-1, print_metrics=False)),
        "empty": _error(lambda: cstorch.utils.benchmark.benchmark_dataloader(
            lambda: [], print_metrics=False)),
    }
    return out


def _settings():
    import cerebras.pytorch as cstorch

    csx = cstorch.backends.csx
    csx.reset()
    defaults = {group: {k: v for k, v in getattr(csx, group).asdict().items()
                        if k not in ("ini", "debug_args")}
                for group in ("precision", "performance", "cluster", "debug")}
    bad = {
        "precision.optimization_level=3": ("precision", "optimization_level", 3),
        "precision.optimization_level='1'": ("precision", "optimization_level", "1"),
        "performance.micro_batch_size=0": ("performance", "micro_batch_size", 0),
        "performance.transfer_processes=0": ("performance", "transfer_processes", 0),
        "performance.compress_weights=1": ("performance", "compress_weights", 1),
        "debug.drop_data='x'": ("debug", "drop_data", "x"),
        "debug.nope=1": ("debug", "nope", 1),
    }
    errors = {k: _error(lambda g=g, n=n, v=v: setattr(getattr(csx, g), n, v))
              for k, (g, n, v) in bad.items()}
    errors["csx.precision=1"] = _error(lambda: setattr(csx, "precision", 1))
    accepted = {}
    for value in ("auto", "explore", None, 8, {"explore": {"min": 1, "max": 4}}):
        csx.performance.micro_batch_size = value
        accepted[json.dumps(value)] = csx.performance.micro_batch_size
    csx.reset()
    from cerebras.pytorch.backend import BackendType
    from cerebras.pytorch.distributed import ClusterConfig

    c = ClusterConfig()
    cluster = {k: getattr(c, k) for k in ("num_csx", "num_workers_per_csx", "max_wgt_servers",
                                          "max_act_per_csx", "job_labels", "mount_dirs",
                                          "python_paths", "automount", "job_time_sec")}
    cluster_errors = {k: _error(lambda k=k, v=v: ClusterConfig(**{k: v}))
                      for k, v in (("num_csx", -1), ("job_time_sec", 0), ("job_priority", "x"))}
    return dict(defaults=defaults, errors=errors, micro_batch_size=accepted,
                cluster_defaults=cluster, cluster_errors=cluster_errors,
                backend_type={"csx": BackendType.from_str("csx").name,
                              "Cpu": BackendType.from_str("Cpu").name,
                              "TPU": _error(lambda: BackendType.from_str("TPU"))})


def main(out):
    fixture = dict(schedule=_schedules(), infer_batch_size=_infer_batch_size(),
                   filters=_filters(), units=_units(), ops=_ops(), benchmark=_benchmark(),
                   settings=_settings())
    (out / "names.json").write_text(json.dumps(fixture, indent=1, sort_keys=True))
