"""The Cerebras import names: ``cerebras.pytorch`` and ``cerebras_pytorch`` are cstream.

Cerebras programs (the Model Zoo's flows and data processors) import ``cerebras.pytorch``
(Release 2.2 on) or ``cerebras_pytorch`` (Release 2.0/2.1), and a few modules of the appliance
client (``cerebras.appliance`` / ``cerebras_appliance``). cstream ships small packages under those
names whose ``__init__`` calls :func:`install`: from then on every ``<alias>.<sub>`` import gives
the module ``<target>.<sub>``, the same object (so ``cerebras.pytorch.optim.Adam is
cstream.optim.Adam``). It happens in every process that imports one of the names: the client,
Ray input workers and their DataLoader worker processes, with nothing in the user's code or
command line.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

# alias prefix -> the module it names
ALIASES = {
    "cerebras.pytorch": "cstream",
    "cerebras_pytorch": "cstream",
    "cerebras.appliance": "cstream.appliance",
    "cerebras_appliance": "cstream.appliance",
}


def target_of(fullname: str) -> str | None:
    """The cstream module that the import name ``fullname`` stands for, or None."""
    for alias, target in ALIASES.items():
        if fullname == alias:
            return target
        if fullname.startswith(alias + "."):
            return target + fullname[len(alias):]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass  # the target module ran its own code when it was imported


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``cerebras.pytorch.X`` (and the other aliases) as the cstream module ``X``."""

    def find_spec(self, fullname, path=None, target=None):
        name = target_of(fullname)
        if name is None or fullname in ALIASES:
            return None  # the alias packages themselves are real files that call install()
        if importlib.util.find_spec(name) is None:
            return None  # the import fails as usual, naming the module the user wrote
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(name))


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())


def become(alias: str) -> None:
    """Make the alias package ``alias`` (being imported) the module it names, and submodules too."""
    install()
    target = ALIASES[alias]
    module = importlib.import_module(target)
    # Submodules already imported are entered under the alias too, so that importing one by
    # the alias finds it in sys.modules and does not set it as an attribute of the package:
    # ``import cerebras.pytorch.backend`` must leave ``cstorch.backend`` the function.
    # list() copies the keys at once: an input worker imports on other threads meanwhile
    for name in [n for n in list(sys.modules) if n.startswith(target + ".")]:
        sys.modules.setdefault(alias + name[len(target):], sys.modules[name])
    from cstream._cerebras_check import check_alias_in_use
    from workers import torch_compat

    check_alias_in_use(alias)
    # Cerebras programs were written for the torch their release pinned (2.4 for 2.10)
    torch_compat.accept_treespec_field_names()
    sys.modules[alias] = module
    parent, _, child = alias.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, module)
