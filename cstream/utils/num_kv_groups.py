"""``groups_annotater(num_kv_groups)``: marks attention code with its number of key/value groups
(grouped-query attention) for the Cerebras compiler's layout. The attention's values do not
depend on it: off a CS-X the decorator is the identity, on the CSX backend an annotation
without effect (:mod:`cstream.core.annotation`).

>>> groups_annotater(num_kv_groups=2)(abs)(-1)
1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cstream.core.annotation import AnnotationMode, create_annotation


@dataclass
class GroupsConfig(AnnotationMode.Config):
    num_kv_groups: Optional[int] = None
    enable_fwd: bool = True
    enable_bwd: bool = True

    def __post_init__(self):
        if self.num_kv_groups is not None and (isinstance(self.num_kv_groups, bool)
                                               or not isinstance(self.num_kv_groups, int)):
            raise TypeError(
                f"Expected `num_kv_groups` to be {int}, got {type(self.num_kv_groups)}.")


def _attribute(config: GroupsConfig, is_backward: bool) -> AnnotationMode.Attribute:
    return AnnotationMode.Attribute("num_kv_groups", config.num_kv_groups)


def groups_annotater(num_kv_groups: Optional[int] = None):
    """A decorator: the identity off a CS-X, else an annotation without effect."""
    from cstream.backend import use_cs

    if not use_cs():
        return lambda fn: fn
    return create_annotation(GroupsConfig, _attribute, num_kv_groups=num_kv_groups)
