"""The sparsity algorithm classes of ``cerebras.pytorch.sparse``: a Model Zoo 2.10 Trainer
builds its config schema as a Union of one config type per non-abstract subclass of
``SparsityAlgorithm`` (constructor signatures → fields), tagged by the lowercased class name.
The classes keep the names, hierarchy and signatures of cerebras-pytorch 2.10; constructing one
raises UnsupportedFeatureError naming the ``sparsity`` setting."""

from __future__ import annotations

import inspect
import typing
from typing import Any, Union

import pytest

import cerebras.pytorch as cstorch
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
