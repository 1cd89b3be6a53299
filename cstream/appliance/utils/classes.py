"""``retrieve_all_subclasses``: every subclass of a class, at any depth.

>>> class A: pass
>>> class B(A): pass
>>> class C(B): pass
>>> [c.__name__ for c in retrieve_all_subclasses(A)]
['B', 'C']
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional


def retrieve_all_subclasses(cls: type, condition: Optional[Callable[[type], bool]] = None
                            ) -> Iterator[type]:
    """The subclasses of ``cls`` depth first (each once), those for which ``condition`` holds
    when it is given."""
    seen = set()

    def walk(c):
        for sub in c.__subclasses__():
            if sub in seen:
                continue
            seen.add(sub)
            if condition is None or condition(sub):
                yield sub
            yield from walk(sub)

    yield from walk(cls)
