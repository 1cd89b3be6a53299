"""Write the reference fixtures by running the real ``cerebras.pytorch`` package.

Run it with ``make reference``: that builds a virtual environment of its own (outside the
checkout) with ``cerebras-pytorch==2.10.0`` and runs this module there, from ``tests/``
(``cd tests && python -m reference.generate``: the generators are the ``reference`` package's,
as the tests import them, and the checkout's own ``cerebras`` alias is not on the path). It is never part of
``make test``; the suite compares cstream against the files it leaves in ``fixtures/``.

Every ``gen_*.py`` module beside this file has a ``main(out: pathlib.Path)`` that writes its
fixtures (JSON, and a few small H5 files the real package saved) into ``out``. Pass module names
(``gen_optim gen_sched``) to run only those. Nothing here imports cstream.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent


def main(argv: list[str]) -> None:
    names = argv or sorted(p.stem for p in HERE.glob("gen_*.py"))
    out = HERE / "fixtures"
    out.mkdir(exist_ok=True)
    import cerebras.pytorch as cstorch

    print(f"reference: cerebras.pytorch {cstorch.__version__} from {cstorch.__file__}")
    for name in names:
        print(f"reference: {name}")
        importlib.import_module(f"reference.{name}").main(out)


if __name__ == "__main__":
    main(sys.argv[1:])
