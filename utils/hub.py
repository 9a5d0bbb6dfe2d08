"""Checkpoints by name on the Hugging Face Hub: ``hf://owner/repo[@revision][/path/in/repo]``.

The released HRM checkpoints (``sapientinc/HRM-checkpoint-sudoku-extreme``, ``-maze-30x30-hard``, ``-ARC-2``) are
a file named ``checkpoint`` (a bare state dict) next to ``all_config.yaml``; TRM repositories hold ``step_<N>``
files. :func:`resolve_checkpoint` turns such a spec into a file in the Hugging Face cache (``HF_HOME``,
``HF_HUB_CACHE``), downloading it with ``huggingface_hub``. The ``all_config.yaml`` beside it comes along into the
same snapshot folder, so "the ``all_config.yaml`` next to the checkpoint" holds for a download as for a local run.
With ``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached, only the cache is read.
"""

from __future__ import annotations

import posixpath
from fnmatch import fnmatch
from pathlib import Path
from typing import Optional

from huggingface_hub import HfApi, constants, hf_hub_download, scan_cache_dir
from huggingface_hub.errors import (CacheNotFound, EntryNotFoundError, HfUriError,
                                    LocalEntryNotFoundError, RemoteEntryNotFoundError, RepositoryNotFoundError,
                                    RevisionNotFoundError)
from huggingface_hub.utils import HfUri, parse_hf_uri

from utils.checkpoint import CheckpointError

HF_PREFIX = "hf://"
DEFAULT_FILE = "checkpoint"  # the released HRM checkpoints
CHECKPOINT_PATTERNS = ("step_*", "*.pt")  # TRM's step_<N>, our step_<N>.pt
CONFIG_FILE = "all_config.yaml"


def resolve_checkpoint(spec: str) -> Path:
    """The local file for a checkpoint spec: a plain path as it is, an ``hf://`` spec downloaded (or found in the
    cache).

    ``hf://owner/repo`` is the repo's ``checkpoint`` file or, without one, its single ``step_*`` or ``*.pt`` file;
    ``hf://owner/repo/path/in/repo`` is that file; ``@revision`` after the repo picks a branch, tag or commit.
    The ``all_config.yaml`` in the checkpoint's folder of the repo, when there is one, is fetched beside it.

    Raises:
        CheckpointError: a malformed spec, a repo or file the Hub does not have, several checkpoint candidates
            (listed), or a file the cache lacks while the Hub cannot be reached (with the command that fetches it).
    """
    if not spec.startswith(HF_PREFIX):
        return Path(spec)
    uri = _parse(spec)
    offline = constants.is_offline_mode()
    path = uri.path_in_repo
    if not path:
        try:
            return _with_config(uri, DEFAULT_FILE, _download(spec, uri, DEFAULT_FILE, offline), offline)
        except RemoteEntryNotFoundError:  # the Hub answered: no such file
            files = HfApi().list_repo_files(uri.id, revision=uri.revision)
        except LocalEntryNotFoundError:  # not cached, and the Hub is off or out of reach: pick among cached files
            offline, files = True, _cached_files(spec, uri)
        path = _single_checkpoint(spec, files)
    try:
        local = _download(spec, uri, path, offline)
    except RemoteEntryNotFoundError:
        raise CheckpointError(f"{spec}: the repo {uri.id} has no file {path}; see its files at "
                              f"{constants.ENDPOINT}/{uri.id}/tree/{uri.revision or 'main'}") from None
    except LocalEntryNotFoundError:
        raise _not_cached(spec, uri, path) from None
    return _with_config(uri, path, local, offline)


def _parse(spec: str) -> HfUri:
    try:
        uri = parse_hf_uri(spec)
    except HfUriError as e:
        raise CheckpointError(f"bad checkpoint spec {spec!r}: {e.msg.strip()} Write hf://owner/repo or "
                              "hf://owner/repo/path/in/repo") from None
    if uri.type != "model":
        raise CheckpointError(f"{spec} names a {uri.type} repository; checkpoints are read from model repositories: "
                              "hf://owner/repo")
    if any(part in (".", "..") for part in (uri.path_in_repo or "").split("/")):
        raise CheckpointError(f"{spec}: a path in a repo cannot hold '.' or '..' segments; write "
                              "hf://owner/repo/path/in/repo as the repo lists it")
    return uri


def _download(spec: str, uri: HfUri, path: str, offline: bool) -> Path:
    """``path`` of the repo in the cache, downloaded unless it is there (``offline``: the cache only).

    Raises:
        CheckpointError: the Hub has no such repo or revision.
        RemoteEntryNotFoundError, LocalEntryNotFoundError: the repo has no such file, or the cache lacks it while
            the Hub is off or out of reach.
    """
    try:
        return Path(hf_hub_download(uri.id, path, revision=uri.revision, local_files_only=offline))
    except RevisionNotFoundError:
        raise CheckpointError(f"{spec}: the repo {uri.id} has no revision {uri.revision!r}") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{spec}: no repo {uri.id} on the Hub (a private or gated one needs `hf auth login`)") \
            from None


def _with_config(uri: HfUri, path: str, local: Path, offline: bool) -> Path:
    """``local``, after fetching the ``all_config.yaml`` of ``path``'s folder in the repo when it has one."""
    try:
        hf_hub_download(uri.id, posixpath.join(posixpath.dirname(path), CONFIG_FILE), revision=uri.revision,
                        local_files_only=offline)
    except EntryNotFoundError:  # none in the repo, or none cached while offline: evaluate.py says what it needs
        pass
    return local


def _cached_files(spec: str, uri: HfUri) -> list[str]:
    """The files of the repo's revision that the cache holds, as paths in the repo.

    Raises:
        CheckpointError: the cache holds no snapshot of this revision.
    """
    revision = uri.revision or constants.DEFAULT_REVISION
    try:
        repos = scan_cache_dir(constants.HF_HUB_CACHE).repos  # where hf_hub_download looks
    except CacheNotFound:
        repos = frozenset()
    for repo in repos:
        if repo.repo_id == uri.id and repo.repo_type == "model":
            for rev in repo.revisions:
                if revision in rev.refs or rev.commit_hash == revision:
                    return sorted(f.file_path.relative_to(rev.snapshot_path).as_posix() for f in rev.files)
    raise _not_cached(spec, uri, None)


def _single_checkpoint(spec: str, files: list[str]) -> str:
    """The one ``step_*`` or ``*.pt`` file among the repo's ``files`` (a ``checkpoint`` file wins).

    Raises:
        CheckpointError: none, or several (listed as the specs that pick each).
    """
    if DEFAULT_FILE in files:
        return DEFAULT_FILE
    candidates = [f for f in files if any(fnmatch(posixpath.basename(f), p) for p in CHECKPOINT_PATTERNS)]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise CheckpointError(f"{spec} holds no checkpoint file ({DEFAULT_FILE}, step_* or *.pt) among "
                              f"{', '.join(files) or 'no files'}; name the file: {spec.rstrip('/')}/<path>")
    raise CheckpointError(f"{spec} holds {len(candidates)} checkpoint files; pick one: "
                          + ", ".join(f"{spec.rstrip('/')}/{c}" for c in candidates))


def _not_cached(spec: str, uri: HfUri, path: Optional[str]) -> CheckpointError:
    why = "HF_HUB_OFFLINE=1 is set" if constants.is_offline_mode() else "the Hub cannot be reached"
    what = f"{path} of {uri.id}" if path else uri.id
    command = " ".join(["hf download", uri.id, *([path] if path else []),
                        *(["--revision", uri.revision] if uri.revision else [])])
    return CheckpointError(f"{spec}: {why} and the Hugging Face cache ({constants.HF_HUB_CACHE}) lacks {what}; "
                           f"download it where there is a network with: {command}")
