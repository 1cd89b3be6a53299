"""Byte units.

>>> convert_byte_unit(3, "B", src_unit="KiB"), convert_byte_unit(1536, "KB", precision=1)
(3072, 1.5)
"""

from __future__ import annotations

_POWER_10 = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}
_POWER_2 = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
_UNITS = {**_POWER_10, **_POWER_2}


def convert_byte_unit(num, tgt_unit: str, /, src_unit: str = "B", precision: int = 0):
    """``num`` ``src_unit`` in ``tgt_unit``, rounded to ``precision`` places (an int for 0)."""
    if precision < 0:
        raise ValueError(f"convert_byte_unit: precision must be >= 0, got {precision}.")
    for what, unit in (("src_unit", src_unit), ("tgt_unit", tgt_unit)):
        if unit not in _UNITS:
            raise ValueError(f"convert_byte_unit: {what} {unit!r} is not one of {list(_UNITS)}.")
    res = round(float(num * _UNITS[src_unit]) / _UNITS[tgt_unit], precision)
    return int(res) if precision == 0 else res


def bytes_to_human(num, /, fmt: str = "{value:.1f}{unit}", log_base: int = 2) -> str:
    """``num`` bytes in the largest unit (up to PiB, or PB with ``log_base=10``) it reaches.

    >>> bytes_to_human(1536), bytes_to_human(1500, log_base=10), bytes_to_human(1023)
    ('1.5KiB', '1.5KB', '1023.0B')
    """
    if log_base == 2:
        units = list(_POWER_2.items())
    elif log_base == 10:
        units = [(u, v) for u, v in _POWER_10.items() if u != "B"]
    else:
        raise ValueError(f"Invalid `log_base`: {log_base}")
    for unit, size in reversed(units):
        if num >= size:
            return fmt.format(value=num / size, unit=unit)
    return fmt.format(value=float(num), unit="B")
