"""The one check for settings that must be positive numbers.

Every layer (``workers``, ``executor``, ``cstream``) checks its positive settings with
:func:`positive_int` or :func:`positive_number`, so each message has the same shape: what was
wrong (the setting and the value given), the rule, and the fix.

>>> positive_int(4, "CSConfig.num_csx")
4
>>> positive_int(0, "CSConfig.num_csx", fix="Set it to 1 or more, e.g. CSConfig(num_csx=1).")
Traceback (most recent call last):
...
ValueError: CSConfig.num_csx: expected a positive int, got 0. Set it to 1 or more, e.g. CSConfig(num_csx=1).
"""

from __future__ import annotations

import difflib
import numbers
from typing import Iterable, Optional, Sequence


def _message(name: str, rule: str, value, fix: Optional[str], default_fix: str) -> str:
    got = "true" if value is True else "false" if value is False else repr(value)
    fix = default_fix if fix is None else fix
    return f"{name}: expected {rule}, got {got}." + (f" {fix}" if fix else "")


def positive_int(value, name: str, *, allow_none: bool = False, fix: Optional[str] = None,
                 error: type[Exception] = ValueError):
    """``value`` if it is an int of 1 or more (``None`` too when ``allow_none``); otherwise
    ``error`` naming ``name``, the rule and ``fix`` (None: "Set it to 1 or more."; "": none,
    where the rule says it all).

    bool is refused although it is an int: ``True`` as a count is always a mistake.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        rule = "a positive int or None" if allow_none else "a positive int"
        raise error(_message(name, rule, value, fix, "Set it to 1 or more."))
    return int(value)


def positive_number(value, name: str, *, allow_none: bool = False, fix: Optional[str] = None,
                    error: type[Exception] = ValueError, unit: Optional[str] = None):
    """``value`` as a float if it is a real number above 0 (``None`` too when ``allow_none``);
    otherwise ``error`` naming ``name``, the rule (``unit``, if given, named in it: "a
    positive number of seconds") and ``fix`` (None: "Set it above 0."; "": none). NaN and
    infinity are refused."""
    if value is None and allow_none:
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0
            or value == float("inf")):
        rule = "a positive number" + (f" of {unit}" if unit else "")
        rule += " or None" if allow_none else ""
        raise error(_message(name, rule, value, fix, "Set it above 0."))
    return float(value)


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """" Did you mean 'x'?" for the valid name closest to a misspelt ``name``; "" when none is
    close. The tail of every unknown-name message.

    >>> did_you_mean("lookahed", ["lookahead", "compiler"])
    " Did you mean 'lookahead'?"
    """
    close = difflib.get_close_matches(name, list(valid), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def known_names(given: Iterable, valid: Sequence[str], *, what: str, where: str,
                error: type = ValueError) -> None:
    """Raise ``error`` naming the first of ``given`` that is not in ``valid``, the closest valid
    name and all of them; ``where`` opens the message, ``what`` names one entry.

    >>> known_names(["lr", "momentun"], ["lr", "momentum"], what="argument", where="SGD: unknown")
    Traceback (most recent call last):
    ...
    ValueError: SGD: unknown argument 'momentun'. Did you mean 'momentum'? Valid arguments: lr, momentum.
    """
    unknown = next((name for name in given if name not in valid), None)
    if unknown is not None:
        raise error(f"{where} {what} {unknown!r}.{did_you_mean(str(unknown), valid)} Valid "
                    f"{what}s: {', '.join(valid)}.")
