"""The pydantic bases of truss (``truss/base/custom_types.py``); configs import it as that module.

Upstream has two flavours and configs depend on the difference:

* :class:`SafeModelNoExtra`: ``strict=True``, ``extra="forbid"``, ``validate_assignment=True``. A
  string is not an enum member, ``"4"`` is not an int, unknown keywords fail.
* :class:`ConfigModel`: lax, ``extra="allow"`` (extras are kept and dumped), assignment validated.
  Extras are only rejected by :meth:`ConfigModel.validate_forbid_extra`, because the server may be
  newer than the client.

Neither is frozen: configs assign fields after construction and that assignment is validated. A
failing constructor or assignment raises ``pydantic.ValidationError`` right there, exactly as
upstream, so a config's own ``try: ... except ValidationError:`` fallback runs; the loader reports
an error that escapes the config (``loader.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic

__all__ = ["ConfigModel", "Example", "SafeModel", "SafeModelNoExtra", "SafeModelNonSerializable"]


@dataclass
class Example:
    """A named example input (upstream's serving examples; kept so the module is complete)."""

    name: str
    input: Any

    @staticmethod
    def from_dict(example_dict: dict[str, Any]) -> Example:
        """``{"name": ..., "input": ...}`` -> Example."""
        return Example(name=example_dict["name"], input=example_dict["input"])

    def to_dict(self) -> dict[str, Any]:
        """The inverse of :meth:`from_dict`."""
        return {"name": self.name, "input": self.input}


_SAFE_MODEL_CONFIG = pydantic.ConfigDict(arbitrary_types_allowed=False, strict=True, validate_assignment=True)


class SafeModelNoExtra(pydantic.BaseModel):
    """Strict base of almost every ``truss_train`` class (upstream ``custom_types.SafeModelNoExtra``).

    Strictness is part of the compatibility contract: a config that passes here must pass on
    Baseten, so ``availability_model="spot"`` or ``cpu_count="4"`` must fail here too.
    """

    model_config = pydantic.ConfigDict(**_SAFE_MODEL_CONFIG, extra="forbid")


class SafeModel(pydantic.BaseModel):
    """Strict, but extras are ignored (upstream ``custom_types.SafeModel``)."""

    model_config = pydantic.ConfigDict(**_SAFE_MODEL_CONFIG)


class SafeModelNonSerializable(pydantic.BaseModel):
    """Strict with arbitrary types allowed (upstream ``custom_types.SafeModelNonSerializable``)."""

    model_config = pydantic.ConfigDict(
        arbitrary_types_allowed=True, strict=True, validate_assignment=True, extra="forbid"
    )


class ConfigModel(pydantic.BaseModel):
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
