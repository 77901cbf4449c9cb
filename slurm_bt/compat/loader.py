"""Load a truss ``config.py`` and report every problem in it at once.

Discovery follows upstream ``truss_train/loader.py`` exactly, because users move configs between
Baseten and Slurm: the path must be a file; the module is named after the file stem, is not added
to ``sys.modules`` and its directory is not put on ``sys.path``; every module-level name is
scanned for ``TrainingProject`` instances and exactly one must exist (an object bound to two
names counts twice).

Error reporting is where slurm-bt differs on purpose. Upstream stops at the first bad
constructor, with no field path. Here the config runs with lenient constructors (``_lenient.py``),
then the project's objects are turned back into plain input (placeholders into the keyword
arguments the config passed, valid objects into their field values) and validated top-down with
``TrainingProject.model_validate``. pydantic then reports every error with its full loc
(``job.compute.accelerator.accelerator``), and valid configs come back as freshly validated
objects. Invalid objects that are not part of the project are reported as ``<Class>.<field>``.
An exception raised by the config's own code becomes one ``line N: <Type>: <message>`` problem.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import traceback
from typing import Any

import pydantic

from slurm_bt.compat import definitions
from slurm_bt.compat._lenient import LenientState, Record, lenient_construction
from slurm_bt.compat.definitions import TrainingProject
from slurm_bt.compat.problems import problems_from_errors
from slurm_bt.compat.shim import truss_modules
from slurm_bt.compat.stricter import stricter_problems
from slurm_bt.errors import ConfigError, Problem

__all__ = ["load_training_project"]

# Upstream prints the class repr; ours lives elsewhere, so the text is pinned to upstream's.
_TARGET_REPR = "<class 'truss_train.definitions.TrainingProject'>"
_MAX_MESSAGE = 300


def load_training_project(path: str | os.PathLike[str]) -> TrainingProject:
    """Execute the config at ``path`` and return its one, fully validated ``TrainingProject``.

    Args:
        path: the config.py file, as the user gave it (used verbatim in error messages).

    Raises:
        ConfigError: listing every problem found, one line each with a dotted field path.
    """
    source = os.fspath(path)
    file = pathlib.Path(source)
    if not file.is_file():
        raise ConfigError(
            source,
            [
                Problem(
                    "",
                    f"`{source}` is not a file. You must point to a python file where "
                    "the training configuration is defined.",
                )
            ],
        )
    state = LenientState()
    problems: list[Problem] = []
    module_vars, crash = _execute(file, state)
    reached: set[int] = set()
    project: TrainingProject | None = None
    if crash is not None:
        problems.append(crash)
    else:
        found = [value for value in module_vars if isinstance(value, TrainingProject)]
        if not found:
            problems.append(Problem("", f"No `{_TARGET_REPR}` was found."))
        elif len(found) > 1:
            problems.append(Problem("", f"Multiple `{_TARGET_REPR}`s were found."))
        else:
            _mark_reachable(found[0], state, reached)
            project = _revalidate(found[0], state, problems)
    problems.extend(_orphan_problems(state, reached))
    if problems or project is None:
        raise ConfigError(source, problems)
    return project


def _execute(file: pathlib.Path, state: LenientState) -> tuple[list[Any], Problem | None]:
    """Run the config with the truss shim and lenient constructors; module values or the crash."""
    spec = importlib.util.spec_from_file_location(file.stem, file)
    if spec is None or spec.loader is None:
        return [], Problem("", f"Could not import `{file}`. Check path.")
    module = importlib.util.module_from_spec(spec)
    with truss_modules(), lenient_construction(state):
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            return [], _crash_problem(exc, spec.origin or os.fspath(file))
    return [getattr(module, name) for name in dir(module)], None


def _crash_problem(exc: BaseException, origin: str) -> Problem:
    """``line N: <Type>: <message>`` for an exception raised while the config ran; no traceback."""
    lineno: int | None = None
    message = str(exc)
    if isinstance(exc, SyntaxError) and exc.filename == origin:
        lineno, message = exc.lineno, exc.msg or message
    hint = ""
    for frame, frame_line in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == origin:
            lineno = frame_line
        code = frame.f_code
        if code.co_name == "from_latest_checkpoint" and code.co_filename == definitions.__file__:
            hint = " (BasetenCheckpoint.from_latest_checkpoint() needs project_name or job_id)"
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in ("truss", "truss_train"):
        hint = (
            " (slurm-bt provides only truss_train, truss_train.definitions, truss_train.public_api"
            " and truss.base.truss_config)"
        )
    message = " ".join(message.split())
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    where = f"line {lineno}: " if lineno is not None else ""
    return Problem("", f"{where}{type(exc).__name__}: {message}{hint}")


def _children(obj: Any, state: LenientState) -> list[Any]:
    """What an object holds: raw arguments for placeholders, field values and extras otherwise."""
    rec = state.record_for(obj)
    if rec is not None:
        return list(rec.raw.values())
    if isinstance(obj, pydantic.BaseModel):
        return [*obj.__dict__.values(), *(obj.__pydantic_extra__ or {}).values()]
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    return []


def _mark_reachable(obj: Any, state: LenientState, reached: set[int], seen: set[int] | None = None) -> None:
    """Collect the ids of placeholders inside the project (their errors get full paths)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if state.record_for(obj) is not None:
        reached.add(id(obj))
    for child in _children(obj, state):
        _mark_reachable(child, state, reached, seen)


def _raw_tree(obj: Any, state: LenientState) -> Any:
    """Plain input equivalent to ``obj``: models become dicts, placeholders their raw kwargs.

    Every model is converted, not only placeholders: pydantic does not re-validate instances, so
    a valid object holding an invalid child would otherwise hide the child's errors.
    """
    rec = state.record_for(obj)
    if rec is not None or isinstance(obj, pydantic.BaseModel):
        items = rec.raw if rec is not None else {**obj.__dict__, **(obj.__pydantic_extra__ or {})}
        out = {key: _raw_tree(value, state) for key, value in items.items()}
        typ = type(obj).model_fields.get("typ")
        if typ is not None and "typ" not in out:
            out["typ"] = typ.default  # keeps checkpoint-ref unions unambiguous
        return out
    if isinstance(obj, dict):
        return {key: _raw_tree(value, state) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_raw_tree(value, state) for value in obj]
    if isinstance(obj, tuple):
        return tuple(_raw_tree(value, state) for value in obj)
    return obj


def _revalidate(
    found: TrainingProject, state: LenientState, problems: list[Problem]
) -> TrainingProject | None:
    """Validate the project top-down (appending problems) and run slurm-bt's stricter checks."""
    tree = _raw_tree(found, state)
    project: TrainingProject | None = None
    with lenient_construction(None):
        try:
            project = TrainingProject.model_validate(tree)
        except pydantic.ValidationError as exc:
            problems.extend(
                problems_from_errors([dict(e) for e in exc.errors(include_url=False)], TrainingProject)
            )
        except Exception as exc:  # a validator crashing on odd input: still one line, no traceback
            problems.append(Problem("", f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
    problems.extend(stricter_problems(project if project is not None else tree))
    return project


def _orphan_problems(state: LenientState, reached: set[int]) -> list[Problem]:
    """Errors of invalid objects outside the project, located as ``<ClassName>.<field>``."""
    out: list[Problem] = []
    records: list[Record] = [r for key, r in state.records.items() if key not in reached and r.errors]
    for rec in records:
        cls = type(rec.obj)
        out.extend(problems_from_errors(rec.errors, cls, prefix=cls.__name__))
    return out
