"""Load a truss ``config.py``; report what is wrong with it one line per problem.

Discovery follows upstream ``truss_train/loader.py`` exactly, because users move configs between
Baseten and Slurm: the path must be a file; the module is named after the file stem, is not added
to ``sys.modules`` and its directory is not put on ``sys.path``; every module-level name is
scanned for ``TrainingProject`` instances and exactly one must exist (an object bound to two
names counts twice).

Validation follows upstream too: a model constructor or assignment that fails raises
``pydantic.ValidationError`` where it happens, so a config's own ``try/except`` fallback runs. What
slurm-bt adds is the report:

* an exception that escapes the config is reported, never as a traceback: a ``ValidationError``
  gives one line per error it holds, each with the config's line and the field path from the model
  that raised (``Compute.accelerator.accelerator``); anything else is one
  ``line N: <Type>: <message>`` line;
* the project the config defines is validated again top-down (:func:`check_project`): mutations
  pydantic does not validate (``job.weights.append(...)``, ``model_construct``) are caught with
  their full path (``job.weights[1].source``), and slurm-bt's stricter checks (``stricter.py``) run,
  each problem on its own line.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import traceback
from typing import Any

import pydantic

from slurm_bt.compat import _truss_train_deployment, definitions, truss_config, truss_constants
from slurm_bt.compat.definitions import TrainingProject
from slurm_bt.compat.problems import problems_from_errors
from slurm_bt.compat.shim import SHIMMED_MODULES, truss_modules
from slurm_bt.compat.stricter import stricter_problems
from slurm_bt.errors import ConfigError, Problem

__all__ = ["check_project", "load_training_project"]

# Upstream prints the class repr; ours lives elsewhere, so the text is pinned to upstream's.
_TARGET_REPR = "<class 'truss_train.definitions.TrainingProject'>"
_MAX_MESSAGE = 300
# Names the shim's modules deliberately lack (with the reason), for the hint on a failed import.
# Keyed by the module's real name, which is what an ImportError carries.
_NOT_PROVIDED: dict[str, tuple[str, dict[str, str]]] = {
    truss_config.__name__: ("truss.base.truss_config", truss_config.NOT_PROVIDED),
    truss_constants.__name__: ("truss.base.constants", truss_constants.NOT_PROVIDED),
    _truss_train_deployment.__name__: ("truss_train.deployment", _truss_train_deployment.NOT_PROVIDED),
}


# The checkpoint-reference classes are private upstream; configs only know their factories.
_PUBLIC_NAMES = {
    "_BasetenLatestCheckpoint": "BasetenCheckpoint.from_latest_checkpoint()",
    "_BasetenNamedCheckpoint": "BasetenCheckpoint.from_named_checkpoint()",
    "_LoopsCheckpoint": "LoopsCheckpoint.from_checkpoint()",
}


def load_training_project(path: str | os.PathLike[str], *, raise_memory_error: bool = False) -> TrainingProject:
    """Execute the config at ``path`` and return its one, fully validated ``TrainingProject``.

    Args:
        path: the config.py file, as the user gave it (used verbatim in error messages).
        raise_memory_error: let a ``MemoryError`` that escapes the config propagate instead of
            reporting it as the config's error: under a memory bound (compat/bounded.py) it means
            the bound was hit, which the caller reports as such.

    Raises:
        ConfigError: listing every problem found, one line each (field path, config line).
        MemoryError: only with ``raise_memory_error``.
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
    module_vars, crash = _execute(file, raise_memory_error)
    if crash:
        raise ConfigError(source, crash)
    found = [value for value in module_vars if isinstance(value, TrainingProject)]
    if not found:
        raise ConfigError(source, [Problem("", f"No `{_TARGET_REPR}` was found.")])
    if len(found) > 1:
        raise ConfigError(source, [Problem("", f"Multiple `{_TARGET_REPR}`s were found.")])
    return check_project(found[0], source)


def check_project(project: TrainingProject, source: str) -> TrainingProject:
    """Validate ``project`` top-down and apply slurm-bt's stricter checks; a fresh validated copy.

    Every path that submits a project calls this (``bt-sbatch``, ``push(Path)``, ``push(project)``),
    so a project built in code gets the checks a config file gets.

    Raises:
        ConfigError: every problem, one line each with its full field path, against ``source``.
    """
    problems: list[Problem] = []
    checked = _revalidate(project, problems)
    if problems or checked is None:
        raise ConfigError(source, problems or [Problem("", "the project could not be validated")])
    return checked


def _execute(file: pathlib.Path, raise_memory_error: bool = False) -> tuple[list[Any], list[Problem]]:
    """Run the config with the truss shim; its module values, or the problems of what escaped."""
    spec = importlib.util.spec_from_file_location(file.stem, file)
    if spec is None or spec.loader is None:
        return [], [Problem("", f"Could not import `{file}`. Check path.")]
    module = importlib.util.module_from_spec(spec)
    origin = spec.origin or os.fspath(file)
    with truss_modules():
        try:
            spec.loader.exec_module(module)
        except pydantic.ValidationError as exc:
            return [], _validation_problems(exc, origin)
        except MemoryError as exc:
            if raise_memory_error:
                raise
            return [], [_crash_problem(exc, origin)]
        except (Exception, SystemExit) as exc:
            return [], [_crash_problem(exc, origin)]
    return [getattr(module, name) for name in dir(module)], []


def _config_line(exc: BaseException, origin: str) -> int | None:
    """The config's line (innermost frame in the config file) an exception passed through."""
    lineno: int | None = None
    for frame, frame_line in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == origin:
            lineno = frame_line
    return lineno


def _raising_model(exc: pydantic.ValidationError) -> type[pydantic.BaseModel] | None:
    """The model class whose constructor, assignment or ``model_validate`` raised ``exc``.

    pydantic names it only by ``exc.title``; the innermost frame holding ``self``/``cls`` of that
    name is the model (``__init__``/``__setattr__``/``model_validate`` of pydantic's BaseModel).
    """
    model: type[pydantic.BaseModel] | None = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        for key in ("self", "cls"):
            value = frame.f_locals.get(key)
            cls = value if isinstance(value, type) else type(value)
            if issubclass(cls, pydantic.BaseModel) and cls.__name__ == exc.title:
                model = cls
    return model


def _validation_problems(exc: pydantic.ValidationError, origin: str) -> list[Problem]:
    """One problem per error of a ValidationError that escaped the config, located by class."""
    lineno = _config_line(exc, origin)
    where = f"line {lineno}: " if lineno is not None else ""
    errors = [dict(e) for e in exc.errors(include_url=False)]
    model = _raising_model(exc)
    problems: list[Problem] | None = None
    if model is not None:
        try:
            problems = problems_from_errors(errors, model, prefix=_PUBLIC_NAMES.get(model.__name__, model.__name__))
        except Exception:  # a config's own model with annotations the formatter does not know
            problems = None
    if problems is None:  # pydantic's own words, still one line per error, never a traceback
        problems = [Problem(exc.title, " ".join(str(e.get("msg", "")).split())) for e in errors]
    return [Problem(p.loc, f"{where}{p.message}") for p in problems]


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
        hint = f" (slurm-bt provides only {', '.join(SHIMMED_MODULES)})"
    not_provided = _not_provided(exc)
    if not_provided is not None:
        message, hint = not_provided, ""
    message = " ".join(message.split())
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    where = f"line {lineno}: " if lineno is not None else ""
    return Problem("", f"{where}{type(exc).__name__}: {message}{hint}")


def _not_provided(exc: BaseException) -> str | None:
    """Why a deliberately missing upstream name is missing (``from truss... import TrussConfig``)."""
    if not isinstance(exc, ImportError) or isinstance(exc, ModuleNotFoundError):
        return None
    public, table = _NOT_PROVIDED.get(exc.name or "", ("", {}))
    for name, reason in table.items():
        if f"cannot import name '{name}'" in str(exc):
            return f"{public}.{name} is not available in slurm-bt: {reason}"
    return None


def _raw_tree(obj: Any) -> Any:
    """Plain input equivalent to ``obj``: every model becomes a dict of its fields and extras.

    Every model is converted: pydantic does not re-validate instances, so a valid object holding an
    invalid child (a list mutated after validation, a ``model_construct``) would hide the child.
    """
    if isinstance(obj, pydantic.BaseModel):
        out = {key: _raw_tree(value) for key, value in {**obj.__dict__, **(obj.__pydantic_extra__ or {})}.items()}
        typ = type(obj).model_fields.get("typ")
        if typ is not None and "typ" not in out:
            out["typ"] = typ.default  # keeps checkpoint-ref unions unambiguous
        return out
    if isinstance(obj, dict):
        return {key: _raw_tree(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_raw_tree(value) for value in obj]
    if isinstance(obj, tuple):
        return tuple(_raw_tree(value) for value in obj)
    return obj


def _revalidate(found: TrainingProject, problems: list[Problem]) -> TrainingProject | None:
    """Validate the project top-down (appending problems) and run slurm-bt's stricter checks."""
    tree = _raw_tree(found)
    project: TrainingProject | None = None
    try:
        project = TrainingProject.model_validate(tree)
    except pydantic.ValidationError as exc:
        problems.extend(problems_from_errors([dict(e) for e in exc.errors(include_url=False)], TrainingProject))
    except Exception as exc:  # a validator crashing on odd input: still one line, no traceback
        problems.append(Problem("", f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
    problems.extend(stricter_problems(project if project is not None else tree))
    return project
