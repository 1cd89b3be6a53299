"""``call_once``: a function that runs once; later calls return its first result.

>>> calls = []
>>> @call_once()
... def setup():
...     calls.append(1)
...     return "ready"
>>> setup(), setup(), calls
('ready', 'ready', [1])
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, Optional


def call_once(error_callable: Optional[Callable] = None):
    """Decorator: the function runs on its first call only. Each later call returns the first
    call's result, after calling ``error_callable()`` if given (it may warn or raise)."""
    def decorate(fn):
        lock = threading.Lock()
        result = []

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with lock:
                if not result:
                    result.append(fn(*args, **kwargs))
                    return result[0]
            if error_callable is not None:
                error_callable()
            return result[0]

        return wrapper

    return decorate
