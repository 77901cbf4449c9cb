"""``hf://org/repo[@revision]``: Hugging Face Hub (or a mirror / the test server at ``hf_endpoint``).

Why huggingface_hub's ``HfApi`` and not its fsspec ``HfFileSystem``: the filesystem resolves a
branch to a commit per path and caches directory listings, while a weights source must be pinned
to *one* commit for the whole listing and every later byte; ``model_info`` + ``list_repo_tree`` at
that commit give exactly that (and the same tree entries ``HfFileSystem`` is built on).

Metadata goes through huggingface_hub (``model_info`` pins the revision to the commit the Hub
answers with; ``list_repo_tree`` gives sizes, LFS sha256 and, for non-LFS files, the git blob sha1
that the download checks). Bytes go through plain ranged GETs on
``/{repo}/resolve/{commit}/{path}``: the commit in the URL pins the version, so a branch that
moves after resolve can never leak into a download. ``token=False`` is passed when
the source has no secret, so a token saved on the login node is never used by accident.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError, SourceUnavailableError
from slurm_bt.storage._http import make_pool, open_http_range
from slurm_bt.storage.base import Backend, Listing, Pinned, RangeStream, RemoteFile, TransportOptions, retry_transient
from slurm_bt.storage.checksums import OriginChecksum
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.url import StorageUrl

__all__ = ["HfBackend"]

_GIT_OID = re.compile(r"^[0-9a-f]{40}$")
_TRANSPORT_HINTS = ("Connect", "Timeout", "Network", "Read", "Protocol", "Remote")


class HfBackend(Backend):
    """A Hub model repository at one revision."""

    def __init__(
        self,
        url: StorageUrl,
        *,
        credentials: Credentials | None,
        endpoints: StorageEndpoints,
        options: TransportOptions,
    ) -> None:
        """Bind to ``url``; no network traffic until :meth:`list_files` or :meth:`open_range`."""
        self.url = url
        self._token = credentials.hf_token if credentials else None
        self._endpoint = endpoints.hf_endpoint
        self._options = options
        self._pool = make_pool(options.connect_timeout_s, options.read_timeout_s, options.max_connections)

    def _map_error(self, exc: Exception) -> SourceError:
        from huggingface_hub import errors as hf_errors

        src = self.uri.canonical
        if isinstance(exc, hf_errors.GatedRepoError):
            return SourceAccessError(src, f"not authorized for {src}: gated repository, request access first")
        if isinstance(exc, hf_errors.RevisionNotFoundError):
            return SourceNotFoundError(src, f"revision {self.uri.revision!r} not found")
        if isinstance(exc, hf_errors.HfHubHTTPError) and exc.response is not None:
            status = exc.response.status_code
            if status in (401, 403):
                # The Hub answers 401 for a private repo it will not reveal: same message either way.
                return SourceAccessError(
                    src, f"not authorized for {src} (HTTP {status}): the token is missing, invalid or "
                    "lacks access (or the repository does not exist)"
                )
            if status == 404:
                return SourceNotFoundError(src, "repository not found (HTTP 404)")
            if status in (408, 429) or status >= 500:
                return SourceUnavailableError(src, f"Hub answered HTTP {status}", transient=True)
            return SourceError(src, f"Hub answered HTTP {status}")
        name = type(exc).__name__
        if isinstance(exc, OSError) or any(h in name for h in _TRANSPORT_HINTS):
            return SourceUnavailableError(src, f"origin unreachable: {name}: {exc}", transient=True)
        return SourceError(src, f"listing failed: {name}: {exc}")

    def _api(self) -> Any:
        from huggingface_hub import HfApi

        return HfApi(endpoint=self._endpoint, token=self._token or False)

    def list_files(self) -> Listing:
        """Pin the revision to the Hub's commit and list every file with its LFS sha256 or git blob id."""
        api = self._api()

        def info() -> Any:
            try:
                return api.model_info(self.uri.container, revision=self.uri.revision,
                                      timeout=self._options.read_timeout_s)
            except Exception as exc:
                raise self._map_error(exc) from exc

        model = retry_transient(info, self._options.list_retries)
        commit: str = model.sha
        pinned = StorageUrl("hf", model.id or self.uri.container, revision=commit)

        def tree() -> list[Any]:
            try:
                return list(api.list_repo_tree(pinned.container, revision=commit, recursive=True))
            except Exception as exc:
                raise self._map_error(exc) from exc

        files = []
        for entry in retry_transient(tree, self._options.list_retries):
            if not hasattr(entry, "blob_id") or entry.size is None:
                continue  # a folder
            lfs = getattr(entry, "lfs", None)
            sha256 = lfs.sha256 if lfs is not None else None
            checks: tuple[OriginChecksum, ...] = ()
            if sha256 is None and _GIT_OID.match(str(entry.blob_id)):
                # A non-LFS file: the tree's oid is git's blob sha1 of the content, so its bytes are
                # checked too (the sha256 naming it is computed from the very bytes published).
                checks = (OriginChecksum("git-sha1", str(entry.blob_id), "git blob id"),)
            files.append(RemoteFile(entry.path, int(entry.size), sha256, etag=sha256 or entry.blob_id,
                                    checksums=checks))
        self.uri = pinned  # from now on every byte comes from this commit, whatever the branch does
        return Listing(pinned, commit, tuple(files))

    def open_range(self, file: Pinned, start: int, end: int | None) -> RangeStream:
        """Ranged GET of ``resolve/<commit>/<path>``; redirects (LFS CDN) are followed."""
        if self.uri.revision is None:
            raise SourceError(self.uri.canonical, "download needs a pinned commit; resolve first")
        url = (
            f"{self._endpoint}/{self.uri.container}/resolve/{quote(self.uri.revision, safe='')}/"
            f"{quote(file.path)}"
        )
        headers = {"Accept-Encoding": "identity"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return open_http_range(
            self._pool, url, uri=self.uri.canonical, file=file.path, start=start, end=end, headers=headers,
            follow_redirects=True,
        )

    def stat(self, path: str) -> RemoteFile:
        """One file of the pinned listing (the Hub has no cheaper per-file call that gives the oids)."""
        for f in self.list_files().files:
            if f.path == path:
                return f
        raise SourceNotFoundError(self.uri.canonical, "file not found at this revision", file=path)

    def close(self) -> None:
        """Close pooled connections."""
        self._pool.clear()
