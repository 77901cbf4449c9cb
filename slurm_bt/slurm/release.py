"""Which Slurm release this is, and which of the newer releases' features slurm-bt may use.

slurm-bt runs on every release from 22.05 (docs/slurm-releases.md); a few things newer releases
offer help users, so they are used where they exist and skipped (never emulated) where not. The
release comes from one ``scontrol --version`` (local, no controller round trip), asked once per
:class:`~slurm_bt.slurm.client.SlurmClient` (:meth:`~slurm_bt.slurm.client.SlurmClient.slurm_release`).
``admin doctor`` uses the controller's own release instead (``SLURM_VERSION`` of ``scontrol show
config``), since its advice is about slurm.conf, which only slurmctld reads.

Every feature is listed once in :data:`FEATURES`, with the first release that has it (from Slurm's
NEWS and man pages; the Debian 12 package's ``/usr/share/doc/slurm-wlm/NEWS.gz`` says ``--prefer``
came with 22.05.0rc1, sid's 26.05 ``sbatch(1)`` documents ``--requeue=expedite``) and what slurm-bt
does with it. A feature that also needs a slurm.conf switch (``--requeue=expedite`` needs
``SlurmctldParameters=enable_expedited_requeue``) is in use only when that switch is set too
(:func:`features_in_use`).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurm_bt.errors import SlurmCommandError
from slurm_bt.slurm.runner import scrubbed_env

if TYPE_CHECKING:
    from slurm_bt.slurm.client import SlurmClient

__all__ = [
    "FEATURES",
    "Feature",
    "SlurmRelease",
    "build_version_argv",
    "feature",
    "features_in_use",
    "parse_release",
    "requeue_option",
    "slurm_release",
]

# ``slurm 22.05.8``, ``slurm-wlm 22.05.8`` (Debian's build), ``slurm 26.05.5``; also the bare
# ``22.05.8`` of ``SLURM_VERSION`` in ``scontrol show config``. Pre-releases read ``23.02.0-0rc1``.
_VERSION = re.compile(r"(?:^|[\s=])(\d{2})\.(\d{2})(?:\.(\d+))?")


@dataclass(frozen=True, order=True)
class SlurmRelease:
    """A Slurm release, e.g. 24.11.5: ``major`` is the year, ``minor`` the month."""

    major: int
    minor: int
    micro: int = 0

    def at_least(self, major: int, minor: int) -> bool:
        """Is this release ``major.minor`` or newer?"""
        return (self.major, self.minor) >= (major, minor)

    def __str__(self) -> str:
        return f"{self.major:02d}.{self.minor:02d}.{self.micro}"


@dataclass(frozen=True)
class Feature:
    """Something a newer release offers and slurm-bt uses where present.

    Attributes:
        name: short id (``"prefer"``).
        since: first release that has it, as ``(major, minor)``.
        what: one line for ``admin doctor`` and the docs.
        needs_config: a ``slurm.conf`` key and a word its value must contain, when the release alone
            is not enough (the feature is switched off by default).
    """

    name: str
    since: tuple[int, int]
    what: str
    needs_config: tuple[str, str] | None = None

    @property
    def since_text(self) -> str:
        """``"23.02"``."""
        return f"{self.since[0]:02d}.{self.since[1]:02d}"


#: What slurm-bt uses from newer releases (docs/slurm-releases.md "Features by release").
FEATURES: tuple[Feature, ...] = (
    Feature("prefer", (22, 5),
            "sbatch --prefer: jobs prefer nodes whose node cache already holds their weights"),
    Feature("prolog_force_requeue_on_fail", (23, 2),
            "PrologFlags=ForceRequeueOnFail: a job whose prolog failed is requeued, even without --requeue",
            needs_config=("PrologFlags", "ForceRequeueOnFail")),
    Feature("split_hook_timeouts", (25, 5),
            "PrologTimeout and EpilogTimeout replace PrologEpilogTimeout (separate bounds per hook)"),
    Feature("requeue_expedite", (25, 11),
            "sbatch --requeue=expedite: a requeued job restarts at once with top priority",
            needs_config=("SlurmctldParameters", "enable_expedited_requeue")),
)


def feature(name: str) -> Feature:
    """The :data:`FEATURES` entry called ``name``.

    Raises:
        KeyError: no such feature.
    """
    for f in FEATURES:
        if f.name == name:
            return f
    raise KeyError(name)


def build_version_argv() -> list[str]:
    """``scontrol --version``: the client release, read locally (no slurmctld round trip)."""
    return ["scontrol", "--version"]


def parse_release(text: str) -> SlurmRelease | None:
    """``slurm-wlm 22.05.8`` / ``slurm 26.05.5`` / ``22.05.8`` → :class:`SlurmRelease`; junk → ``None``."""
    m = _VERSION.search(text.strip())
    if m is None:
        return None
    major, minor = int(m.group(1)), int(m.group(2))
    if not 14 <= major <= 99 or not 1 <= minor <= 12:  # year.month: anything else is not a release
        return None
    return SlurmRelease(major, minor, int(m.group(3)) if m.group(3) else 0)


def features_in_use(release: SlurmRelease | None, config: Mapping[str, str] | None = None) -> dict[str, bool]:
    """Which :data:`FEATURES` slurm-bt uses on ``release``: ``{name: in use}``, every feature listed.

    A feature with ``needs_config`` is in use only when ``config`` (``scontrol show config``) has
    that switch; without ``config`` it counts as off (it is opt-in on the cluster). An unknown
    release uses nothing optional.
    """
    out: dict[str, bool] = {}
    for f in FEATURES:
        ok = release is not None and release.at_least(*f.since)
        if ok and f.needs_config is not None:
            key, word = f.needs_config
            value = (config or {}).get(key, "")
            ok = word in {w.strip() for w in value.split(",")}
        out[f.name] = ok
    return out


def requeue_option(release: SlurmRelease | None, config: Mapping[str, str] | None = None) -> str:
    """The sbatch option that makes a job requeueable: ``--requeue=expedite`` where the release has
    it (>= 25.11) and slurm.conf enables it (``SlurmctldParameters=enable_expedited_requeue``; else
    slurmctld ignores the request), ``--requeue`` otherwise.

    For long-run restarts (docs/long-runs.md): an expedited requeue starts the job again at once
    with the highest priority instead of queueing it behind everything submitted meanwhile.
    """
    return "--requeue=expedite" if features_in_use(release, config)["requeue_expedite"] else "--requeue"


# ------------------------------------------------------------------------- the release of a client


_PROBED: weakref.WeakKeyDictionary[SlurmClient, SlurmRelease | None] = weakref.WeakKeyDictionary()


def slurm_release(client: SlurmClient) -> SlurmRelease | None:
    """The release of ``client``'s Slurm commands (``scontrol --version``), asked once per client.

    ``None`` when scontrol cannot say (missing, a fake that does not answer it): the caller then uses
    no optional feature, which is always correct, only less helpful.
    """
    if client in _PROBED:
        return _PROBED[client]
    try:
        result = client.runner.run(build_version_argv(), env=scrubbed_env(client.environ),
                                   timeout_s=min(client.timeout_s, 10))
    except SlurmCommandError:
        found = None
    else:
        found = parse_release(result.stdout) if result.ok else None
    _PROBED[client] = found
    return found
