"""The two pydantic bases of truss (``truss/base/custom_types.py``), plus lenient loading.

Upstream has two flavours and configs depend on the difference:

* :class:`SafeModelNoExtra`: ``strict=True``, ``extra="forbid"``, ``validate_assignment=True``. A
  string is not an enum member, ``"4"`` is not an int, unknown keywords fail.
* :class:`ConfigModel`: lax, ``extra="allow"`` (extras are kept and dumped), assignment validated.
  Extras are only rejected by :meth:`ConfigModel.validate_forbid_extra`, because the server may be
  newer than the client.

Neither is frozen: configs assign fields after construction and that assignment is validated.

Both share :class:`_LenientModel`, which only differs from ``pydantic.BaseModel`` while the loader
runs a config (see ``_lenient.py``): then a failing constructor or assignment records the problem
instead of raising, so that the loader can report every problem with its full field path.
"""

from __future__ import annotations

from typing import Any

import pydantic

from slurm_bt.compat._lenient import Record, active_state, contains_placeholder

__all__ = ["ConfigModel", "SafeModelNoExtra"]


def _become_placeholder(obj: pydantic.BaseModel, raw: dict[str, Any]) -> None:
    """Fill ``obj`` in place exactly as ``model_construct(**raw)`` would fill a new instance.

    ``__init__`` cannot return a different object, so the attributes of a constructed twin are
    moved into ``obj``. No validation happens: the values stay as the config wrote them.
    """
    twin = type(obj).model_construct(**raw)
    object.__setattr__(obj, "__dict__", twin.__dict__)
    object.__setattr__(obj, "__pydantic_fields_set__", twin.__pydantic_fields_set__)
    object.__setattr__(obj, "__pydantic_extra__", twin.__pydantic_extra__)
    object.__setattr__(obj, "__pydantic_private__", twin.__pydantic_private__)


def _current_raw(obj: pydantic.BaseModel) -> dict[str, Any]:
    """The current state of a validated instance (all fields and extras) as constructor keywords.

    All fields, not only the explicitly set ones: a default sub-object may have been changed in
    place (``job.compute.node_count = 2``) and must not be lost.
    """
    return {**obj.__dict__, **(obj.__pydantic_extra__ or {})}


class _LenientModel(pydantic.BaseModel):
    """``pydantic.BaseModel`` whose constructor and assignments are lenient during a load.

    Outside a load both methods defer straight to pydantic, so behaviour equals upstream.
    """

    def __init__(self, /, **data: Any) -> None:
        state = active_state()
        if state is None or state.depth > 0:
            super().__init__(**data)
            return
        raw = dict(data)  # before-validators may mutate the dict pydantic is given
        state.depth += 1
        try:
            super().__init__(**data)
        except pydantic.ValidationError as exc:
            errors = [dict(e) for e in exc.errors(include_url=False)]
            state.records[id(self)] = Record(self, raw, errors)
            _become_placeholder(self, raw)
        except Exception:
            # A validator tripped over an invalid child (e.g. reading ``w.auth.auth_method`` on a
            # placeholder): the child is reported, this object just cannot be checked yet.
            # Anything else is the config's own error and must surface as upstream would raise it.
            if not contains_placeholder(raw, state):
                raise
            state.records[id(self)] = Record(self, raw)
            _become_placeholder(self, raw)
        finally:
            state.depth -= 1

    # Tell pydantic this is still the base ``__init__``: otherwise it would route
    # ``model_validate`` (and every nested dict) through it, dropping the validation context
    # that ``ConfigModel.validate_forbid_extra`` relies on.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: Any) -> None:
        state = active_state()
        is_data = name in type(self).model_fields or (
            self.__pydantic_extra__ is not None and not name.startswith("_")
        )
        if state is None or state.depth > 0 or not is_data:
            super().__setattr__(name, value)
            return
        rec = state.record_for(self)
        if rec is None:
            try:
                super().__setattr__(name, value)
                return
            except pydantic.ValidationError as exc:
                errors = [dict(e) for e in exc.errors(include_url=False)]
                rec = Record(self, _current_raw(self), errors)
                state.records[id(self)] = rec
        # Placeholders are not validated again here; the loader validates the raw tree at the end.
        rec.raw[name] = value
        if name in type(self).model_fields:
            self.__dict__[name] = value
            self.__pydantic_fields_set__.add(name)
        elif self.__pydantic_extra__ is not None:
            self.__pydantic_extra__[name] = value


_SAFE_MODEL_CONFIG = pydantic.ConfigDict(arbitrary_types_allowed=False, strict=True, validate_assignment=True)


class SafeModelNoExtra(_LenientModel):
    """Strict base of almost every ``truss_train`` class (upstream ``custom_types.SafeModelNoExtra``).

    Strictness is part of the compatibility contract: a config that passes here must pass on
    Baseten, so ``availability_model="spot"`` or ``cpu_count="4"`` must fail here too.
    """

    model_config = pydantic.ConfigDict(**_SAFE_MODEL_CONFIG, extra="forbid")


class ConfigModel(_LenientModel):
    """Lax base that keeps unknown keys (upstream ``custom_types.ConfigModel``).

    Upstream tolerates extras because a server built from an older truss must still parse a
    newer client's dump; :meth:`validate_forbid_extra` is the explicit client-side check.
    """

    model_config = pydantic.ConfigDict(validate_assignment=True, extra="allow", arbitrary_types_allowed=False)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _maybe_forbid_extra(cls, data: Any, info: pydantic.ValidationInfo) -> Any:
        if info.context and info.context.get("forbid_extra") and isinstance(data, dict):
            extra_fields = set(data) - set(cls.model_fields)
            if extra_fields:
                raise ValueError(
                    f"Extra fields not allowed: [{', '.join(sorted(extra_fields))}]. Possibly "
                    "this field is only supported by newer truss versions, check for updates."
                )
        return data

    def validate_forbid_extra(self) -> None:
        """Raise ``ValidationError`` if the instance carries keys the model does not define."""
        type(self).model_validate(self.model_dump(mode="json"), context={"forbid_extra": True})

    def to_dict(self, verbose: bool = False) -> dict[str, Any]:
        """JSON-mode dump; non-verbose drops None and default values, as upstream does."""
        kwargs: dict[str, Any] = (
            {"mode": "json"}
            if verbose
            else {
                "mode": "json",
                "exclude_unset": False,
                "exclude_none": True,
                "exclude_defaults": True,
                "context": {"verbose": verbose},
            }
        )
        result: dict[str, Any] = super().model_dump(**kwargs)
        return result
