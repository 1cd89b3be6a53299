"""What a Model Zoo 2.10 Trainer reads from cstream's classes to build its config schema: a Union
of one config type per non-abstract subclass of ``SparsityAlgorithm`` (and of ``Optimizer``,
``LRScheduler``, ``WeightDecayScheduler``), each from ``inspect.signature(cls.__init__)``, whose
annotations it matches as objects (``ParamsT`` → a list of groups, ``(float, "lr")`` → a field
aliased ``learning_rate``). The sparsity classes keep the names, hierarchy and signatures of
cerebras-pytorch 2.10; constructing one raises UnsupportedFeatureError naming the ``sparsity``
setting. The Trainer then builds its backend with ``cstorch.backend(BackendType.CPU, ...)``."""

from __future__ import annotations

import inspect
import typing
from typing import Any, Union

import pytest

import cerebras.pytorch as cstorch
from cerebras.pytorch.backend import BackendType
from cerebras.pytorch.optim.optimizer import ParamsT
from cstream.appliance.utils.classes import retrieve_all_subclasses
from cstream.unsupported import UnsupportedFeatureError


def _config_type(cls: type):
    """A config type from ``cls.__init__``'s signature, as the Trainer's schema builds one:
    every named parameter becomes a field with its resolved annotation and default."""
    hints = typing.get_type_hints(cls.__init__)
    fields = [(name, hints.get(name, Any)) for name, p in inspect.signature(cls.__init__).parameters
              .items() if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return typing.NamedTuple(f"{cls.__name__}Config", fields)


def _schema():
    algorithms = [cls for cls in retrieve_all_subclasses(cstorch.sparse.SparsityAlgorithm)
                  if not inspect.isabstract(cls)]
    return algorithms, Union[tuple(_config_type(cls) for cls in algorithms)]


def test_trainer_style_schema_unions_one_config_per_concrete_algorithm():
    algorithms, schema = _schema()
    assert sorted(cls.__name__.lower() for cls in algorithms) == ["gmp", "group", "rigl", "set",
                                                                   "static"]
    assert len(typing.get_args(schema)) == 5
    fields = {t.__name__: t._fields for t in typing.get_args(schema)}
    assert fields == {"StaticConfig": ("sparsity",), "GMPConfig": (), "SETConfig": ("drop_fraction",),
                      "RigLConfig": ("drop_fraction", "balance_in_groups", "balance_out_groups"),
                      "GroupConfig": ("groups",)}


def test_hierarchy_and_defaults_match_cerebras_pytorch_2_10():
    sparse = cstorch.sparse
    assert inspect.isabstract(sparse.SparsityAlgorithm)
    assert inspect.isabstract(sparse.DynamicSparsityAlgorithm)
    for cls in (sparse.GMP, sparse.SET, sparse.RigL):
        assert cls.__bases__ == (sparse.DynamicSparsityAlgorithm,)
    for cls in (sparse.Static, sparse.Group, sparse.DynamicSparsityAlgorithm):
        assert issubclass(cls, sparse.SparsityAlgorithm)

    def defaults(cls):
        return {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not p.empty}

    assert defaults(sparse.SparsityAlgorithm) == {"init_method": "random"}
    assert defaults(sparse.Static) == {"sparsity": None}
    assert defaults(sparse.DynamicSparsityAlgorithm) == {"sparsity": None, "update": None}
    assert defaults(sparse.SET) == {"drop_fraction": 0.3}
    assert defaults(sparse.RigL) == {"drop_fraction": 0.3, "balance_in_groups": None,
                                     "balance_out_groups": None}
    assert defaults(sparse.Group) == {"groups": None}


@pytest.mark.parametrize("name, kwargs", [
    ("Static", {"sparsity": 0.5}), ("GMP", {"sparsity": 0.3, "update": {"freq": 10}}),
    ("SET", {"drop_fraction": 0.2, "sparsity": 0.5}), ("RigL", {"sparsity": 0.5}),
    ("Group", {"groups": {}}),
])
def test_constructing_an_algorithm_names_the_sparsity_setting(name, kwargs):
    with pytest.raises(UnsupportedFeatureError,
                       match=rf"cerebras\.pytorch\.sparse\.{name}; the `sparsity` setting"):
        getattr(cstorch.sparse, name)(**kwargs)


@pytest.mark.parametrize("base", [cstorch.optim.Optimizer, cstorch.optim.lr_scheduler.LRScheduler,
                                  cstorch.optim.weight_decay_scheduler.WeightDecayScheduler,
                                  cstorch.sparse.SparsityAlgorithm])
def test_constructor_annotations_are_objects_not_strings(base):
    strings = [f"{cls.__name__}.{name}: {p.annotation!r}" for cls in retrieve_all_subclasses(base)
               for name, p in inspect.signature(cls.__init__).parameters.items()
               if isinstance(p.annotation, str)]
    assert strings == []


def test_optimizer_signatures_carry_the_types_the_schema_maps():
    subclasses = retrieve_all_subclasses(cstorch.optim.Optimizer)
    # cstream's own (other tests define subclasses of their own in this process)
    public = [cls for cls in subclasses if not cls.__name__.startswith("_")
              and cls.__module__.startswith("cstream.")]
    assert len(public) == 15
    for cls in public:
        params = inspect.signature(cls.__init__).parameters
        assert params["params"].annotation == ParamsT, cls.__name__
        assert params["lr"].annotation is float, cls.__name__
    adamw = inspect.signature(cstorch.optim.AdamW.__init__).parameters
    assert {n: p.annotation for n, p in adamw.items() if n not in ("self", "params", "lr")} == {
        "betas": typing.Tuple[float, float], "eps": float, "weight_decay": float,
        "correct_bias": bool, "amsgrad": bool}


def test_backend_accepts_a_backend_type(ray_session):
    backend = cstorch.backend(BackendType.CPU)
    assert backend.backend_type is BackendType.CPU
    with pytest.raises(TypeError, match="expected a string such as 'CSX' or 'CPU' or a "
                                        "BackendType, got 3"):
        cstorch.backend(3)


@pytest.mark.parametrize("base", [cstorch.optim.lr_scheduler.LRScheduler,
                                  cstorch.optim.weight_decay_scheduler.WeightDecayScheduler])
def test_scheduler_optimizer_is_annotated_as_torch_optimizer(base):
    # the schema maps this annotation to an optional field a configuration leaves out
    import torch
    schedulers = [cls for cls in retrieve_all_subclasses(base)  # cstream's own, not tests'
                  if cls.__module__.startswith("cstream.")]
    assert len(schedulers) > 10
    params = [inspect.signature(cls.__init__).parameters for cls in schedulers]
    wrong = [cls.__name__ for cls, p in zip(schedulers, params)  # Chained*: no optimizer argument
             if "optimizer" in p and p["optimizer"].annotation is not torch.optim.Optimizer]
    assert wrong == []
