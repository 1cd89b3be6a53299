"""How ``cstream COMMAND`` words an error raised through the driver actor: the chain Ray and
the client build, made here with Ray's own exception classes (no cluster)."""

from __future__ import annotations

import ray

from cstream_tools.cli_errors import format_error
from executor.backends.driver_client import input_side_error
from workers.errors import AutoscaleError


def _raised_in_the_client(error: BaseException) -> BaseException:
    """``error`` as the client raises it after the driver actor raised it: Ray's
    ``RayTaskError`` of it (an instance of the error's class too), unwrapped by the driver
    client into the input side's own error, the Ray error as its ``__cause__``."""
    try:
        raise error
    except AutoscaleError as e:
        wrapped = ray.exceptions.RayTaskError(
            "WaferDriver.open_input", "Traceback (most recent call last):\n  ...\n"
            f"workers.errors.AutoscaleError: {e}", e).as_instanceof_cause()
    mine = input_side_error(wrapped)
    assert mine is error and mine.__cause__ is wrapped  # the chain leads back to itself
    return mine


def test_an_input_side_refusal_through_the_driver_is_one_headline_not_a_recursion():
    message = ("CSConfig.num_workers_per_csx='auto': the loader synthetic_input_fn builds "
               "cannot be re-formed exactly with another worker count")
    text = format_error("run", _raised_in_the_client(AutoscaleError(message)))
    lines = text.splitlines()
    assert lines[0] == f"cstream run: error: AutoscaleError: {message}"
    assert lines[-1] == "(run again with --debug for the whole traceback)"


def test_debug_prints_the_chain_with_the_remote_traceback():
    error = _raised_in_the_client(AutoscaleError("refused"))
    text = format_error("run", error, debug=True)
    assert text.splitlines()[:3] == ["cstream run: error: AutoscaleError: refused", "",
                                     "the whole chain (--debug):"]
    assert "ray.exceptions.RayTaskError(AutoscaleError)" in text and text.rstrip().endswith(
        "workers.errors.AutoscaleError: refused")
