"""Make ``import truss_train`` and ``from truss.base import truss_config`` work inside a config.

Configs and scripts are written for Baseten and import ``truss_train`` (``.definitions``,
``.public_api``, ``.loader``, ``.deployment``) and ``truss.base`` (``.truss_config``, ``.constants``,
``.custom_types``). slurm-bt does not ship packages with
those names: a ``truss`` package of ours would shadow (or be shadowed by) the real truss when
both are installed. Instead :func:`truss_modules` points those names in ``sys.modules`` at our
modules only while a config is executed, and puts back whatever was there before.

While active, *every* ``truss``/``truss_train`` module is hidden, including real truss
submodules imported earlier, so a config sees the same thing on every machine: our modules, and
a clear ModuleNotFoundError for any other truss module.

The swap is process-global (``sys.modules``), so it is serialised with a re-entrant lock: a second
thread waits, and a nested load in the same thread (a config calling ``push(Path(...))``) works.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from collections.abc import Iterator

from slurm_bt.compat import (
    _base,
    _truss_train,
    _truss_train_deployment,
    _truss_train_loader,
    definitions,
    public_api,
    truss_config,
    truss_constants,
)

__all__ = ["SHIMMED_MODULES", "install_truss_modules", "truss_modules"]

_ROOTS = ("truss", "truss_train")
_LOCK = threading.RLock()


def _package(name: str, doc: str, **attrs: types.ModuleType) -> types.ModuleType:
    """A bare package module (empty ``__path__``, so other submodules are simply not found)."""
    module = types.ModuleType(name, doc)
    module.__path__ = []
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def _shim_modules() -> dict[str, types.ModuleType]:
    """The module objects configs get, by the dotted name they import."""
    truss_base = _package(
        "truss.base",
        "slurm-bt stand-in for truss.base (truss_config, constants, custom_types).",
        truss_config=truss_config,
        constants=truss_constants,
        custom_types=_base,
    )
    truss = _package("truss", "slurm-bt stand-in for truss (only truss.base).", base=truss_base)
    return {
        "truss": truss,
        "truss.base": truss_base,
        "truss.base.truss_config": truss_config,
        "truss.base.constants": truss_constants,
        "truss.base.custom_types": _base,
        "truss_train": _truss_train,
        "truss_train.definitions": definitions,
        "truss_train.public_api": public_api,
        "truss_train.loader": _truss_train_loader,
        "truss_train.deployment": _truss_train_deployment,
    }


SHIMMED_MODULES: tuple[str, ...] = tuple(_shim_modules())
"""Names a config can import while :func:`truss_modules` is active."""


def _is_truss_name(name: str) -> bool:
    return any(name == root or name.startswith(root + ".") for root in _ROOTS)


@contextlib.contextmanager
def truss_modules() -> Iterator[None]:
    """Alias the truss module names to slurm-bt's modules for the ``with`` body, then restore.

    Entries that existed before (a real truss install) are saved and put back unchanged; entries
    created during the body under those names are removed.
    """
    with _LOCK:
        saved = {name: mod for name, mod in sys.modules.items() if _is_truss_name(name)}
        for name in saved:
            del sys.modules[name]
        sys.modules.update(_shim_modules())
        try:
            yield
        finally:
            for name in [n for n in sys.modules if _is_truss_name(n)]:
                del sys.modules[name]
            sys.modules.update(saved)


def install_truss_modules() -> None:
    """Alias the truss module names to slurm-bt's modules for the rest of the process.

    For ``slurm-bt run SCRIPT``, whose process exists to run the script: holding
    :func:`truss_modules`' lock for the whole script would deadlock a script that pushes from
    several threads (each push loads a config, which takes the lock). Loads inside still use
    :func:`truss_modules` and put these entries back afterwards.
    """
    with _LOCK:
        for name in [n for n in sys.modules if _is_truss_name(n)]:
            del sys.modules[name]
        sys.modules.update(_shim_modules())
