"""Reference figures for ``cstream.metrics``: every metric of the real ``cerebras.pytorch.metrics``.

Writes ``fixtures/metrics.json``:

* ``signatures``: the parameters of every metric's ``__init__`` and ``update`` (name, kind,
  default), as ``inspect.signature`` gives them;
* ``cases``: a metric built with fixed arguments, fed three updates of fixed inputs (the inputs
  are stored: the test feeds cstream the same tensors). After each update the value of
  ``compute()`` (and whether it is a tensor or a Python float, and its dtype); after the last the
  metric's registered state; then ``reset()``: the value, ``num_updates`` and state after it, and
  the value once the first update is fed again. Within a case every update has the same
  arguments and shapes, so the test can also replay the case as one traced step;
* ``fresh``: the value of a metric that was never updated;
* ``registry``: the names ``get_all_metrics()`` gives to metrics built with and without names;
* ``errors``: constructor arguments the real package refuses, and the exception's type.

The real package runs eagerly here (no backend), where its ``update`` reads values freely.
"""

from __future__ import annotations

import inspect
import json
import math

import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch import metrics as M

UPDATES = 3
CLASSES = [
    "AccuracyMetric", "AUCMetric", "DiceCoefficientMetric", "FBetaScoreMetric", "MeanIOUMetric",
    "MeanMetric", "MeanPerClassAccuracyMetric", "PerplexityMetric", "PrecisionAtKMetric",
    "RecallAtKMetric",
]


# -- encoding ------------------------------------------------------------------------------------

def enc(value):
    """A JSON form of an update argument or a result: tensors keep dtype and shape."""
    if isinstance(value, torch.Tensor):
        return {"tensor": value.reshape(-1).tolist(), "dtype": str(value.dtype).split(".")[1],
                "shape": list(value.shape)}
    if isinstance(value, torch.dtype):
        return {"torch_dtype": str(value).split(".")[1]}
    return value


def dec(value):
    if isinstance(value, dict) and "tensor" in value:
        dtype = getattr(torch, value["dtype"])
        return torch.tensor(value["tensor"], dtype=dtype).reshape(value["shape"])
    if isinstance(value, dict) and "torch_dtype" in value:
        return getattr(torch, value["torch_dtype"])
    return value


def result(value) -> dict:
    kind = "tensor" if isinstance(value, torch.Tensor) else type(value).__name__
    out = {"type": kind, "value": float(value)}
    if isinstance(value, torch.Tensor):
        out["dtype"] = str(value.dtype).split(".")[1]
        out["shape"] = list(value.shape)
    if math.isnan(out["value"]):
        out["value"] = "nan"
    return out


def state(metric) -> dict:
    return {name: enc(buf.detach().clone()) for name, buf in metric.named_buffers()}


# -- inputs ---------------------------------------------------------------------------------------

def gen(seed):
    return torch.Generator().manual_seed(seed)


def class_batches(seed, k, shape=(24,), weights=None, hit=0.5):
    """Labels in [0, k), predictions equal to them with probability ``hit``; weights: None,
    "mask" (0/1), "real" (fractional, some 0)."""
    g = gen(seed)
    out = []
    for _ in range(UPDATES):
        labels = torch.randint(0, k, shape, generator=g)
        noisy = torch.randint(0, k, shape, generator=g)
        predictions = torch.where(torch.rand(shape, generator=g) < hit, labels, noisy)
        upd = {"labels": labels, "predictions": predictions}
        if weights == "mask":
            upd["weights"] = (torch.rand(shape, generator=g) < 0.7).float()
        elif weights == "real":
            upd["weights"] = torch.rand(shape, generator=g) * (torch.rand(shape, generator=g) < 0.8)
        out.append(upd)
    return out


def auc_batches(seed, n=40, weighted=False, grid=None):
    g = gen(seed)
    out = []
    for _ in range(UPDATES):
        if grid is None:
            preds = torch.rand(n, generator=g)
        else:  # predictions exactly on the default threshold grid, and on 0 and 1
            preds = torch.randint(0, grid, (n,), generator=g).float() / (grid - 1)
        labels = (torch.rand(n, generator=g) < preds * 0.6 + 0.2).long()
        upd = {"labels": labels, "predictions": preds}
        if weighted:
            upd["weights"] = torch.rand(n, generator=g) * (torch.rand(n, generator=g) < 0.8)
        out.append(upd)
    return out


def at_k_batches(seed, weights=None, batch=8, classes=10, num_labels=3):
    g = gen(seed)
    out = []
    for _ in range(UPDATES):
        scores = torch.randn(batch, classes, generator=g)
        labels = torch.stack([torch.randperm(classes, generator=g)[:num_labels]
                              for _ in range(batch)])
        upd = {"labels": labels, "predictions": scores}
        if weights == "vector":
            upd["weights"] = torch.rand(batch, generator=g)
        elif weights == "scalar":
            upd["weights"] = torch.tensor(0.5)
        out.append(upd)
    return out


def mean_batches(seed, weight=None):
    g = gen(seed)
    out = []
    for _ in range(UPDATES):
        upd = {"value": torch.randn(3, 5, generator=g)}
        if weight == "tensor":
            upd["weight"] = torch.rand(5, generator=g)
        elif weight == "float":
            upd["weight"] = 2.5
        out.append(upd)
    return out


def perplexity_batches(seed, weighted):
    g = gen(seed)
    out = []
    for _ in range(UPDATES):
        labels = torch.randint(0, 11, (2, 6), generator=g)
        logits = torch.randn(2, 6, 11, generator=g)
        per_token = torch.nn.functional.cross_entropy(
            logits.reshape(-1, 11), labels.reshape(-1), reduction="none").reshape(2, 6)
        upd = {"labels": labels}
        if weighted:
            mask = (torch.rand(2, 6, generator=g) < 0.7).long()
            upd["loss"] = (per_token * mask).sum()
            upd["weights"] = mask
        else:
            upd["loss"] = per_token.sum()
        out.append(upd)
    return out


def with_arg(batches, **extra):
    return [{**b, **extra} for b in batches]


def cases():
    """(id, class, positional args, keyword args, updates)."""
    c = []
    acc = "AccuracyMetric"
    c += [("accuracy/unweighted", acc, ["accuracy"], {}, class_batches(0, 5)),
          ("accuracy/mask_weights", acc, ["accuracy"], {}, class_batches(1, 5, weights="mask")),
          ("accuracy/fractional_weights", acc, [], {"name": "acc"},
           class_batches(2, 5, weights="real")),
          ("accuracy/2d_float16", acc, ["acc2d"], {},
           with_arg(class_batches(3, 4, shape=(3, 8)), dtype=torch.float16)),
          ("accuracy/all_zero_weights", acc, ["acc0"], {},
           [{**b, "weights": torch.zeros(24)} for b in class_batches(4, 3)])]
    mean = "MeanMetric"
    c += [("mean/unweighted", mean, ["mean"], {}, mean_batches(10)),
          ("mean/tensor_weight", mean, ["mean"], {}, mean_batches(11, "tensor")),
          ("mean/float_weight_float16", mean, ["mean"], {},
           with_arg(mean_batches(12, "float"), dtype=torch.float16))]
    ppl = "PerplexityMetric"
    c += [("perplexity/unweighted", ppl, ["ppl"], {}, perplexity_batches(20, False)),
          ("perplexity/mask_weights", ppl, ["ppl"], {}, perplexity_batches(21, True))]
    fb = "FBetaScoreMetric"
    for i, (kw, tag) in enumerate([
            ({}, "micro"), ({"average_type": "macro"}, "macro"),
            ({"beta": 0.5, "ignore_labels": [2]}, "micro_beta0.5_ignore2"),
            ({"beta": 2.0, "average_type": "macro", "ignore_labels": [0, 4]},
             "macro_beta2_ignore0_4")]):
        c.append((f"fbeta/{tag}", fb, [5], {**kw, "name": "f"}, class_batches(30 + i, 5)))
    # six classes, labels and predictions in 0..4: class 5 never occurs
    c.append(("fbeta/unseen_class_macro", fb, [6], {"average_type": "macro"},
              class_batches(34, 5)))
    c.append(("fbeta/binary_float16", fb, [2], {"name": "f1"},
              with_arg(class_batches(35, 2), dtype=torch.float16)))
    for cls, tag in (("MeanIOUMetric", "miou"), ("DiceCoefficientMetric", "dice")):
        c += [(f"{tag}/unweighted", cls, [6], {"name": tag}, class_batches(40, 5)),
              (f"{tag}/weights", cls, [6], {"name": tag}, class_batches(41, 5, weights="real")),
              (f"{tag}/ignore_1", cls, [6], {"ignore_classes": [1]},
               class_batches(42, 5, weights="mask")),
              (f"{tag}/2d", cls, [3, None, tag], {}, class_batches(43, 3, shape=(2, 4, 4)))]
    mpca = "MeanPerClassAccuracyMetric"
    c += [("mpca/unweighted_unseen_class", mpca, [6], {"name": "mpca"}, class_batches(50, 5)),
          ("mpca/weights", mpca, [5, "mpca"], {}, class_batches(51, 5, weights="real")),
          ("mpca/2d_float16", mpca, [4], {},
           with_arg(class_batches(52, 4, shape=(3, 8)), dtype=torch.float16))]
    auc = "AUCMetric"
    c += [("auc/roc_default", auc, [], {"name": "auc"}, auc_batches(60)),
          ("auc/roc_weights", auc, [], {}, auc_batches(61, weighted=True)),
          ("auc/pr_interpolation", auc, [50, "PR"], {}, auc_batches(62)),
          ("auc/pr_interpolation_weights", auc, [], {"curve": "PR"},
           auc_batches(63, weighted=True)),
          ("auc/roc_minoring", auc, [20], {"summation_method": "minoring"}, auc_batches(64)),
          ("auc/roc_majoring", auc, [20], {"summation_method": "majoring"}, auc_batches(65)),
          ("auc/pr_minoring", auc, [], {"curve": "PR", "summation_method": "minoring"},
           auc_batches(66)),
          ("auc/pr_majoring", auc, [30, "PR"], {"summation_method": "majoring"},
           auc_batches(67)),
          ("auc/thresholds", auc, [], {"thresholds": [0.7, 0.1, 0.3, 0.5, 0.9]},
           auc_batches(68, weighted=True)),
          ("auc/pr_thresholds", auc, [], {"curve": "PR", "thresholds": [0.25, 0.5, 0.75]},
           auc_batches(69)),
          ("auc/predictions_on_the_grid", auc, [11], {}, auc_batches(70, grid=11)),
          ("auc/pr_predictions_on_the_grid", auc, [11, "PR"], {}, auc_batches(71, grid=11)),
          ("auc/no_positive_label", auc, [], {},
           [{**b, "labels": torch.zeros_like(b["labels"])} for b in auc_batches(72)]),
          ("auc/pr_no_positive_label", auc, [], {"curve": "PR"},
           [{**b, "labels": torch.zeros_like(b["labels"])} for b in auc_batches(73)])]
    for cls, tag in (("PrecisionAtKMetric", "precision_at_k"), ("RecallAtKMetric",
                                                                 "recall_at_k")):
        c += [(f"{tag}/k1", cls, [1], {"name": tag}, at_k_batches(80)),
              (f"{tag}/k3_vector_weights", cls, [3], {}, at_k_batches(81, "vector")),
              (f"{tag}/k2_scalar_weight", cls, [2, tag], {}, at_k_batches(82, "scalar")),
              (f"{tag}/k4_one_label", cls, [4], {}, at_k_batches(83, num_labels=1))]
    return c


# -- running the real package ----------------------------------------------------------------------

def build(cls_name, args, kwargs):
    return getattr(M, cls_name)(*[dec(a) for a in args], **{k: dec(v) for k, v in kwargs.items()})


def run_case(case_id, cls_name, args, kwargs, updates) -> dict:
    keys = [sorted(u) for u in updates]
    assert all(k == keys[0] for k in keys), case_id
    metric = build(cls_name, args, kwargs)
    after_each = []
    for upd in updates:
        metric.update(**upd)
        after_each.append(result(metric.compute()))
    record = {
        "id": case_id, "cls": cls_name, "args": [enc(a) for a in args],
        "kwargs": {k: enc(v) for k, v in kwargs.items()},
        "updates": [{k: enc(v) for k, v in u.items()} for u in updates],
        "after_each": after_each, "num_updates": metric.num_updates, "state": state(metric),
    }
    metric.reset()
    record["after_reset"] = {"value": result(metric.compute()), "num_updates": metric.num_updates,
                             "state": state(metric)}
    metric.update(**updates[0])
    record["after_reset_and_first_update"] = result(metric.compute())
    # calling the metric updates it and returns compute()
    record["call_returns"] = result(metric(**updates[1]))
    return record


def fresh_values() -> dict:
    made = {
        "AccuracyMetric": M.AccuracyMetric("a"), "MeanMetric": M.MeanMetric("m"),
        "PerplexityMetric": M.PerplexityMetric("p"), "FBetaScoreMetric": M.FBetaScoreMetric(3),
        "MeanIOUMetric": M.MeanIOUMetric(3), "DiceCoefficientMetric": M.DiceCoefficientMetric(3),
        "MeanPerClassAccuracyMetric": M.MeanPerClassAccuracyMetric(3),
        "AUCMetric": M.AUCMetric(), "AUCMetric/PR": M.AUCMetric(curve="PR"),
        "PrecisionAtKMetric": M.PrecisionAtKMetric(2), "RecallAtKMetric": M.RecallAtKMetric(2),
    }
    return {k: result(m.compute()) for k, m in made.items()}


def signatures() -> dict:
    out = {}
    for name in CLASSES:
        cls = getattr(M, name)
        out[name] = {}
        for method in ("__init__", "update"):
            params = list(inspect.signature(getattr(cls, method)).parameters.values())[1:]
            out[name][method] = [
                [p.name, p.kind.name,
                 "<required>" if p.default is inspect.Parameter.empty else enc(p.default)]
                for p in params]
    return out


def registry() -> dict:
    M.Metric.registry.clear()
    M.AccuracyMetric("eval/accuracy")
    M.AccuracyMetric("eval/accuracy")
    M.PerplexityMetric("eval/perplexity")
    M.MeanIOUMetric(3, name="eval/miou")
    names = [name for name, _ in M.get_all_metrics()]
    return {"built": [["AccuracyMetric", "eval/accuracy"], ["AccuracyMetric", "eval/accuracy"],
                      ["PerplexityMetric", "eval/perplexity"], ["MeanIOUMetric", "eval/miou"]],
            "names": names, "has_compute_all_metrics": hasattr(M, "compute_all_metrics"),
            "all": list(M.__all__),
            "unnamed_metric_name": repr(M.MeanIOUMetric(3).name)}


ERRORS = [
    ("FBetaScoreMetric", [1], {}), ("FBetaScoreMetric", [3], {"beta": 0}),
    ("FBetaScoreMetric", [3], {"average_type": "weighted"}),
    ("AUCMetric", [], {"curve": "DET"}), ("AUCMetric", [1], {}),
    ("AUCMetric", [], {"summation_method": "trapezoid"}),
    ("AccuracyMetric", [], {}),
]


def errors() -> list:
    out = []
    for cls_name, args, kwargs in ERRORS:
        try:
            build(cls_name, args, kwargs)
        except Exception as e:  # noqa: BLE001 - the type is the figure recorded
            out.append({"cls": cls_name, "args": args, "kwargs": kwargs,
                        "error": type(e).__name__})
        else:
            raise AssertionError(f"{cls_name}(*{args}, **{kwargs}) was accepted")
    return out


def dumps(data: dict) -> str:
    """Compact JSON with one top-level entry, and one case, a line (readable diffs)."""
    lines = []
    for key, value in data.items():
        if key == "cases":
            body = ",\n".join(json.dumps(c, separators=(",", ":")) for c in value)
            lines.append(f'"cases":[\n{body}\n]')
        else:
            lines.append(f"{json.dumps(key)}:{json.dumps(value, separators=(',', ':'))}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(out):
    torch.manual_seed(0)
    data = {
        "version": cstorch.__version__, "torch": torch.__version__,
        "signatures": signatures(),
        "cases": [run_case(*case) for case in cases()],
        "fresh": fresh_values(),
        "registry": registry(),
        "errors": errors(),
    }
    path = out / "metrics.json"
    path.write_text(dumps(data))
    print(f"  {path.name}: {len(data['cases'])} cases")
