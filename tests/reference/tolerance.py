"""How close cstream's numbers must be to numbers another program made on another machine.

The fixtures under ``fixtures/`` were written by the real ``cerebras.pytorch`` (torch 2.4) on one
CPU; the suite checks them with torch 2.13 on whatever CPU runs it. The same float32 formula gives
results a few ulps apart on two CPUs: MKL's sgemm and ATen's vector kernels (sums, ``exp``,
``sqrt``, ``cos``, ``randn``'s transform) pick their code path by instruction set, and a different
summation order or polynomial rounds differently. Measured: 1.2e-6 to 5.4e-6 relative after at
most 13 optimizer steps on a Sapphire Rapids Xeon against fixtures made elsewhere.

So a comparison with another program's numbers allows:

- relative: ``ULPS_PER_STEP`` float32 ulps for every step the value went through. A step is a few
  dozen kernels, each a few ulps apart across CPUs; the differences add up (and an adaptive
  optimizer's division by ``sqrt(v)`` can amplify them) rather than cancel, so the bound grows
  linearly with the steps: 16 ulps a step is 1.9e-6 a step, 3.8e-5 after 20 steps;
- absolute: the same relative bound times the largest magnitude in the tensor compared. An element
  that cancels towards 0 (a weight crossing 0, a difference of two near equals) keeps the rounding
  of the operands it came from, which are of the tensor's scale, not of its own.

Two runs of cstream on one machine (CSX against the CPU backend at one thread count) are compared
exactly elsewhere in the suite; this module is only for numbers made by another program or CPU.
"""

from __future__ import annotations

import math
import re

import torch

FLOAT32_EPS = torch.finfo(torch.float32).eps  # 1.19e-7: one ulp at 1.0
ULPS_PER_STEP = 16


def rel_bound(steps: int) -> float:
    """The relative difference float32 allows between two CPUs after ``steps`` steps (≥ 1)."""
    return max(int(steps), 1) * ULPS_PER_STEP * FLOAT32_EPS


def assert_tensor_close(ours: torch.Tensor, theirs: torch.Tensor, steps: int, what: str,
                        equal_nan: bool = False) -> None:
    """``ours`` within :func:`rel_bound` of ``theirs``, with the absolute floor described above."""
    rtol = rel_bound(steps)
    finite = theirs[torch.isfinite(theirs)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=rtol * scale + 1e-30,
                               equal_nan=equal_nan,
                               msg=lambda m: f"{what} (bound after {steps} steps: {rtol:.2g} "
                                             f"relative): {m}")


def assert_number_close(ours: float, theirs: float, steps: int, what: str,
                        scale: float | None = None) -> None:
    """One number within :func:`rel_bound`; ``scale``: the magnitude of the operands it came from
    when that exceeds its own (a value near 0)."""
    if math.isnan(theirs):
        assert math.isnan(ours), f"{what}: {ours}, the reference is nan"
        return
    if math.isinf(theirs):
        assert ours == theirs, f"{what}: {ours}, the reference is {theirs}"
        return
    rtol = rel_bound(steps)
    bound = rtol * max(abs(theirs), abs(scale or 0.0))
    assert abs(ours - theirs) <= bound, (
        f"{what}: {ours!r} against the reference's {theirs!r}: {abs(ours - theirs):.3g} apart, "
        f"more than float32 allows after {steps} steps ({bound:.3g})")


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)")


def printed_digits_unit(text: str) -> float:
    """One unit in the last printed digit of ``text`` (``0.907888`` → 1e-6, ``1.2e-05`` → 1e-7)."""
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def assert_lines_close(ours: str, theirs: str, steps: int, what: str) -> None:
    """Two printed lines (``ours``: cstream's; ``theirs``: the reference's, or the other way
    round when the real package printed ``ours``) say the same: their words equal, their numbers within
    :func:`rel_bound` plus one unit in the last printed digit (each side rounded its own float
    to the printed digits, so one rounding boundary between them moves the text by one unit)."""
    words_ours, words_theirs = _NUMBER.split(ours), _NUMBER.split(theirs)
    nums_ours, nums_theirs = _NUMBER.findall(ours), _NUMBER.findall(theirs)
    assert words_ours == words_theirs and len(nums_ours) == len(nums_theirs), (
        f"{what}: {ours!r} against {theirs!r}")
    for a, b in zip(nums_ours, nums_theirs):
        if a == b:
            continue
        x, y = float(a), float(b)
        bound = rel_bound(steps) * abs(y) + max(printed_digits_unit(a), printed_digits_unit(b))
        assert abs(x - y) <= bound, (
            f"{what}: {ours!r} against {theirs!r}: {a} and {b} are "
            f"{abs(x - y):.3g} apart, more than float32 allows after {steps} steps plus one "
            f"printed digit ({bound:.3g})")
