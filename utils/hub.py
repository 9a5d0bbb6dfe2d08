"""Checkpoints by name on the Hugging Face Hub: ``hf://owner/repo[@revision][/path/in/repo]``.

The released HRM checkpoints (``sapientinc/HRM-checkpoint-sudoku-extreme``, ``-maze-30x30-hard``, ``-ARC-2``) are
a file named ``checkpoint`` (a bare state dict) next to ``all_config.yaml``; TRM repositories hold ``step_<N>``
files. :func:`resolve_checkpoint` turns such a spec into a file in the Hugging Face cache (``HF_HOME``,
``HF_HUB_CACHE``), downloading it with ``huggingface_hub``. The ``all_config.yaml`` beside it comes along into the
same snapshot folder, so "the ``all_config.yaml`` next to the checkpoint" holds for a download as for a local run.
With ``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached, only the cache is read.

What every command that reaches the Hub shares (the dataset builders' utils/data/hub_source.py too):

- a revision is a branch, tag or commit name by git's rules (:func:`revision_problem`), checked before any request:
  huggingface_hub writes a branch or tag into its cache as the file ``refs/<revision>``, unchecked, so ``../x``
  would be written outside the cache;
- one short request (:func:`hub_answers`) tells whether the Hub answers, before anything waits out the client's
  retries: where it does not, the cache is read at once;
- an answer keeps a minimum pace (:func:`prepare_client`), so a server that drips bytes cannot hold a command for
  hours;
- an endpoint that answers, but not as a Hub does (a missing ``X-Repo-Commit``, a malformed commit id or listing;
  a mirror or proxy that ``HF_ENDPOINT`` names), is reported as that (:func:`odd_answers_as`), not as an
  unreachable Hub or a traceback;
- the HTTP client's per-request INFO lines stay out of the command's output (:func:`prepare_client`).
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import re
import time
from fnmatch import fnmatch
from pathlib import Path
from typing import Callable, Iterator, Optional

import httpx2
from huggingface_hub import HfApi, constants, get_session, hf_hub_download, scan_cache_dir
from huggingface_hub.errors import (CacheNotFound, EntryNotFoundError, FileMetadataError, HfHubHTTPError, HfUriError,
                                    HFValidationError, LocalEntryNotFoundError, RemoteEntryNotFoundError,
                                    RepositoryNotFoundError, RevisionNotFoundError)
from huggingface_hub.utils import HfUri, parse_hf_uri, validate_repo_id
from tqdm import tqdm

from utils.checkpoint import CheckpointError
from utils.errors import first_in_chain

HF_PREFIX = "hf://"
DEFAULT_FILE = "checkpoint"  # the released HRM checkpoints
CHECKPOINT_PATTERNS = ("step_*", "*.pt")  # TRM's step_<N>, our step_<N>.pt
CONFIG_FILE = "all_config.yaml"
PROBE_TIMEOUT_S = 5.0  # the one request that tells whether the Hub answers: offline, a command fails within 10 s
DOWNLOAD_GRACE_S = 30.0  # an answer may start slowly for this long ...
DOWNLOAD_MIN_RATE = 10_000  # ... then must have averaged this many bytes a second (a 1 GB file: 28 h at most)
HTTP_LOGGERS = ("httpx2", "httpx")  # their INFO line per request ("HTTP Request: HEAD ...") is not for the user


def resolve_checkpoint(spec: str) -> Path:
    """The local file for a checkpoint spec: a plain path as it is, an ``hf://`` spec downloaded (or found in the
    cache).

    ``hf://owner/repo`` is the repo's ``checkpoint`` file or, without one, its single ``step_*`` or ``*.pt`` file;
    ``hf://owner/repo/path/in/repo`` is that file; ``@revision`` after the repo picks a branch, tag or commit.
    The ``all_config.yaml`` in the checkpoint's folder of the repo, when there is one, is fetched beside it.

    Raises:
        CheckpointError: a malformed spec (a revision that is not a branch, tag or commit name among them), a repo or
            file the Hub does not have, several checkpoint candidates (listed), a file the cache lacks while the Hub
            cannot be reached (with the command that fetches it), an endpoint that does not answer as a Hub does, or
            a download under the pace :func:`prepare_client` keeps.
    """
    if not spec.startswith(HF_PREFIX):
        return Path(spec)
    uri = _parse(spec)
    prepare_client()
    with odd_answers_as(lambda why: CheckpointError(f"{spec}: {why}")):
        offline = constants.is_offline_mode() or not _hub_answers(spec, uri)
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
    problem = uri.revision is not None and revision_problem(uri.revision)
    if problem:
        raise CheckpointError(f"{spec}: the revision {uri.revision!r} is not a branch, tag or commit name ({problem}); "
                              "write hf://owner/repo@<branch, tag or commit>/path/in/repo")
    return uri


def _hub_answers(spec: str, uri: HfUri) -> bool:
    """:func:`hub_answers` for the model repo of ``spec``.

    Raises:
        CheckpointError: the Hub has no such repo or revision.
    """
    try:
        return hub_answers(uri.id, "model", uri.revision)
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise _missing(spec, uri, e) from None


def _missing(spec: str, uri: HfUri, error: Exception) -> CheckpointError:
    """The error for the Hub's answer that it has no such repo, or no such revision of it (``error``)."""
    if isinstance(error, RevisionNotFoundError):
        return CheckpointError(f"{spec}: the repo {uri.id} has no revision {uri.revision!r}")
    return CheckpointError(f"{spec}: no repo {uri.id} on the Hub (a private or gated one needs `hf auth login`)")


def _download(spec: str, uri: HfUri, path: str, offline: bool) -> Path:
    """``path`` of the repo in the cache, downloaded unless it is there (``offline``: the cache only).

    Raises:
        CheckpointError: the Hub has no such repo or revision, answered not as a Hub does, or too slowly.
        RemoteEntryNotFoundError, LocalEntryNotFoundError: the repo has no such file, or the cache lacks it while
            the Hub is off or out of reach.
    """
    try:
        with odd_answers_as(lambda why: CheckpointError(f"{spec}: {why}")):  # before the cache's lack is taken for it
            return Path(hf_hub_download(uri.id, path, revision=uri.revision, local_files_only=offline))
    except DownloadTooSlow as e:
        raise CheckpointError(f"{spec}: {e}; rerun on a faster connection, or fetch it where there is one with: "
                              f"{_download_command(uri, path)} (it then stays in the Hugging Face cache)") from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise _missing(spec, uri, e) from None


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
    return CheckpointError(f"{spec}: {why} and the Hugging Face cache ({constants.HF_HUB_CACHE}) lacks {what}; "
                           f"download it where there is a network with: {_download_command(uri, path)}")


def _download_command(uri: HfUri, path: Optional[str]) -> str:
    """The ``hf download`` command that puts ``path`` of the repo (None: the whole repo) into the cache."""
    return " ".join(["hf download", uri.id, *([path] if path else []),
                     *(["--revision", uri.revision] if uri.revision else [])])


# ---- what every command that reaches the Hub shares ---------------------------------------------------------

_COMMIT = re.compile(r"[0-9a-f]{40}")
# Characters git refuses in a ref name (git check-ref-format): control characters, space, ~ ^ : ? * [ and \.
_REF_REFUSED = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def revision_problem(revision: str) -> Optional[str]:
    """Why ``revision`` cannot be a branch, tag or commit of a Hub repo, in a few words; None when it can.

    A commit is 40 hex digits; a branch or tag follows git's rules for ref names (``git check-ref-format``; the
    Hub's ``refs/pr/1`` is one): no ``..``, no segment that is empty or starts with ``.`` or ends with ``.lock``, no
    trailing ``.``, no ``@{``, none of the characters git refuses. So it stays inside the ``refs`` folder of the
    cache, where huggingface_hub writes it as a path.
    """
    if _COMMIT.fullmatch(revision):
        return None
    if not revision or revision == "@":
        return "it is empty" if not revision else "'@' alone is not a name"
    if ".." in revision:
        return "it holds '..'"
    if _REF_REFUSED.search(revision):
        return "it holds a space, a control character or one of ~ ^ : ? * [ \\"
    if "@{" in revision:
        return "it holds '@{'"
    if revision.endswith("."):
        return "it ends with '.'"
    for part in revision.split("/"):
        if not part:
            return "it has an empty segment (a leading, trailing or doubled '/')"
        if part.startswith(".") or part.endswith(".lock"):
            return f"its segment {part!r} starts with '.' or ends with '.lock'"
    return None


def repo_problem(repo_id: str) -> Optional[str]:
    """Why ``repo_id`` cannot name a Hub repo (``owner/name``, or a bare ``name`` for the Hub's canonical repos), in
    a few words, by huggingface_hub's own rule; None when it can."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return ("a repo id is owner/name: at most one '/', letters, digits, '-', '_' and '.', no '--' or '..', not "
                "starting or ending with '-' or '.', at most 96 characters")
    return None


def hub_answers(repo_id: str, repo_type: str, revision: Optional[str]) -> bool:
    """Whether the Hub answers for ``repo_id`` at ``revision`` (None: ``main``), asked once, with no retries and a
    :data:`PROBE_TIMEOUT_S` timeout; False when it is out of reach or failing (no network, a firewall, the Hub down),
    where the caller reads the Hugging Face cache alone.

    Raises:
        RepositoryNotFoundError, RevisionNotFoundError: the Hub answered that there is no such repo or revision.
        ValueError, TypeError, KeyError: an answer that is not a Hub's (see :func:`odd_answers_as`).
    """
    try:
        HfApi().repo_info(repo_id, repo_type=repo_type, revision=revision, timeout=PROBE_TIMEOUT_S)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise
    except (httpx2.TransportError, HfHubHTTPError, DownloadTooSlow):
        return False
    return True


@contextlib.contextmanager
def odd_answers_as(error: Callable[[str], Exception]) -> Iterator[None]:
    """Within the block, an answer of ``HF_ENDPOINT`` that huggingface_hub cannot use because it is not a Hub's
    raises ``error(why)``, ``why`` saying so in one line: a file's answer without ``X-Repo-Commit`` or ``ETag``
    (huggingface_hub then reports the cache's lack as if the Hub were out of reach), a commit id that is not a
    folder name (``ValueError: Invalid pointer path``), a body that is not the JSON a Hub sends (``TypeError``,
    ``KeyError``, ``JSONDecodeError``). Other exceptions pass."""
    try:
        yield
    except LocalEntryNotFoundError as e:
        metadata = first_in_chain(e, lambda x: isinstance(x, FileMetadataError))
        if metadata is None:
            raise
        raise error(_not_a_hub(metadata)) from None
    except (ValueError, TypeError, KeyError) as e:
        raise error(_not_a_hub(e)) from None


def _not_a_hub(answer: BaseException) -> str:
    """One line: ``HF_ENDPOINT`` answered, but not as a Hub does (``answer`` says how), and what to check."""
    how = str(answer).split(". ")[0].strip() or type(answer).__name__
    how = " ".join(how.split())
    return (f"{constants.ENDPOINT} answered, but not as a Hugging Face Hub does ({type(answer).__name__}: {how}); "
            "point HF_ENDPOINT at the Hub or at a mirror that serves its API (a proxy may be changing its answers)")


class DownloadTooSlow(Exception):
    """An answer of the Hub arrived under the pace :func:`prepare_client` holds it to; the message says by how much
    (one line)."""


class _PacedStream(httpx2.SyncByteStream):
    """The body of one HTTP answer, read as it arrives, raising :class:`DownloadTooSlow` once it has averaged under
    :data:`DOWNLOAD_MIN_RATE` bytes a second after its first :data:`DOWNLOAD_GRACE_S` seconds: the overall deadline
    that the client's per-read timeout is not (a server that sends a byte every few seconds never trips it)."""

    def __init__(self, stream: httpx2.SyncByteStream, url: httpx2.URL, size: Optional[str]):
        self._stream, self._url, self._size = stream, url, size

    def __iter__(self) -> Iterator[bytes]:
        began, received = time.monotonic(), 0
        for chunk in self._stream:  # each piece as the network gives it, before the client gathers them
            received += len(chunk)
            elapsed = time.monotonic() - began
            if elapsed > DOWNLOAD_GRACE_S and received < DOWNLOAD_MIN_RATE * elapsed:
                size = f" of {tqdm.format_sizeof(int(self._size))}B" if (self._size or "").isdigit() else ""
                raise DownloadTooSlow(f"{self._url.host}{self._url.path} sent {received} bytes{size} in "
                                      f"{elapsed:.0f} s, under the {tqdm.format_sizeof(DOWNLOAD_MIN_RATE)}B/s a "
                                      "download must keep")
            yield chunk

    def close(self) -> None:
        self._stream.close()


def _pace(response: httpx2.Response) -> None:
    """An HTTP client's response hook: the body is read through :class:`_PacedStream`."""
    response.stream = _PacedStream(response.stream, response.request.url, response.headers.get("Content-Length"))


def prepare_client() -> None:
    """Make huggingface_hub's HTTP client (shared by every call in this process) fit for a command: its answers keep
    a minimum pace (:class:`_PacedStream`), and its INFO line per request ("HTTP Request: HEAD ...") stays out of
    the output, where the entry points log INFO: a Hub command prints its own lines, a failing one its error
    alone. Call it before reaching the Hub; calling it again does nothing more."""
    for name in HTTP_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    session = get_session()  # a new one after huggingface_hub's close_session, hence the check each time
    hooks = session.event_hooks
    if _pace not in hooks.get("response", []):
        session.event_hooks = {**hooks, "response": [*hooks.get("response", []), _pace]}
