"""Shell quoting for generated scripts.

Everything slurm-bt writes into a script goes through here. Values are single-quoted (nothing inside
single quotes is special to bash), and the only unquoted expansions we ever emit are our own
``${SLURM_*}`` variable references, marked explicitly with :class:`Var`. A value that contains a
newline stays inside its quotes, so a smuggled ``#SBATCH`` line can never become a directive: sbatch
stops reading directives at the first non-comment line, and every value line is a command line.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Var", "sbatch_directive_value", "shq", "shq_concat"]

_SAFE_DIRECTIVE = re.compile(r"^[A-Za-z0-9_.,:=%@/+\-\[\]]*$")


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def shq(value: str) -> str:
    """Quote one value for bash.

    Plain text uses ``shlex.quote`` (single quotes, ``'`` written as ``'"'"'``). A value with control
    characters (newline, CR, ESC, ...) becomes an ANSI-C string ``$'...'`` with ``\\xHH`` escapes: still
    a literal, but the script stays printable one-line-per-statement text (sbatch refuses ``\\r\\n``
    and a raw ESC would drive the terminal of whoever runs ``--dry-run``).
    """
    if not _CONTROL.search(value):
        return shlex.quote(value)
    out = []
    for ch in value:
        if ch in "\\'":
            out.append("\\" + ch)
        elif _CONTROL.match(ch):
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


@dataclass(frozen=True)
class Var:
    """A reference to a shell variable we set or Slurm sets, emitted as ``"${NAME}"``."""

    name: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", self.name):
            raise ValueError(f"not a variable name: {self.name!r}")


def shq_concat(parts: Iterable[str | Var]) -> str:
    """One shell word made of quoted literals and variable references, e.g. ``'/x/'"${SLURM_JOB_ID}"``."""
    out = []
    for part in parts:
        if isinstance(part, Var):
            out.append(f'"${{{part.name}}}"')
        elif part:
            out.append(shq(part))
    return "".join(out) or "''"


def sbatch_directive_value(value: str) -> str:
    """Check a value destined for an ``#SBATCH`` line.

    sbatch parses directive lines itself (no shell), so quoting does not help there: instead, only
    values made of a conservative character set are allowed, and the caller guarantees they come
    from validated config or site settings. Anything else is a bug, not a user error.
    """
    if not _SAFE_DIRECTIVE.match(value):
        raise ValueError(f"unsafe #SBATCH value: {value!r}")
    return value
