"""Parameter filters: which parameters a setting applies to, by glob patterns over their names.

>>> f = make_param_filter(["*.bias", "norm.*"])
>>> [f(n, None) for n in ("fc.bias", "norm.weight", "fc.weight")]
[True, True, False]
"""

from __future__ import annotations

import fnmatch
import inspect
import re
from typing import Callable, List, Union

from torch import nn

FilterCallable = Callable[[str, nn.Parameter], bool]


def convert_glob_to_regex(f: str) -> re.Pattern:
    """The glob ``f`` as a compiled regex (match it with ``fullmatch``)."""
    if not isinstance(f, str):
        raise TypeError(f"filter must be a string or list of strings, got {type(f)}")
    return re.compile(fnmatch.translate(f))


def _takes_name_and_param(fn) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True  # a builtin without a signature: trust the caller
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) == 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def make_param_filter(param_filter: Union[str, List[str], FilterCallable]) -> FilterCallable:
    """A ``(name, param) -> bool`` filter: a glob, a list of globs (any matching the whole name),
    or such a callable itself."""
    if callable(param_filter):
        if not _takes_name_and_param(param_filter):
            raise ValueError(
                f'Unknown `param_filter`: "{param_filter}". Valid options are a string, or a '
                f"list of strings representing the filter, or a function with signature "
                f"{FilterCallable}.")
        return param_filter
    patterns = [convert_glob_to_regex(p) for p in
                ([param_filter] if isinstance(param_filter, str) else param_filter)]

    def glob_expression_param_filter(name: str, param: nn.Parameter) -> bool:
        return any(p.fullmatch(name) for p in patterns)

    return glob_expression_param_filter
