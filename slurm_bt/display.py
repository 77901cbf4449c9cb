"""Text for a terminal: user-controlled strings with their invisible characters made visible.

Project, job and checkpoint names, cache paths and weights sources come from configs, indexes and
file systems other people write. Printed raw, a right-to-left override (U+202E) makes
``gnp.exe`` read as ``exe.png``, a newline or ESC forges a table row or a terminal escape, and a
zero-width character makes two different names look alike. Every table and line slurm-bt prints
passes such strings through :func:`visible`; JSON (and CSV) output stays exact, as machines read
it (docs/cli.md, "What is escaped").

Base layer, standard library only, so every layer that renders text can use the one helper.
"""

from __future__ import annotations

import unicodedata

__all__ = ["visible"]

#: Categories escaped: control (Cc: C0, DEL, C1), format (Cf: bidi embeddings/overrides/isolates
#: U+202A-U+202E and U+2066-U+2069, zero-width characters, U+FEFF...), surrogates (Cs: undecodable
#: bytes kept by ``surrogateescape``), and the line and paragraph separators (Zl, Zp), which break a
#: line in many terminals.
_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: object) -> str:
    """``str(text)`` with every control, format (bidi), surrogate and line/paragraph separator
    character written as a Python-style escape (``\\u202e``, ``\\x1b``, ``\\n``).

    Printable text, including any script and emoji, is left as it is; ``str.isascii`` text without
    control characters (the common case) is returned without a per-character walk.
    """
    s = str(text)
    if s.isascii() and s.isprintable():
        return s
    return "".join(_escape(c) if unicodedata.category(c) in _ESCAPED else c for c in s)
