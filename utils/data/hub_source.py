"""The published puzzle CSVs on the Hugging Face Hub, fetched as the reference builders fetch them.

``sapientinc/HRM``'s ``dataset/build_sudoku_dataset.py`` and ``build_maze_dataset.py`` read
``hf_hub_download(source_repo, f"{set_name}.csv", repo_type="dataset")``. :func:`fetch_csvs` does the same into the
Hugging Face cache (``HF_HOME``, ``HF_HUB_CACHE``), so a second build, or one with ``HF_HUB_OFFLINE=1``, reads the
cache and needs no network; the builders then read the cached files exactly as they read ``--source-dir``. The
first file is fetched at the revision asked for (which records it in the cache's refs, for offline reruns), the
others at the commit it resolved to, so every CSV comes from one commit.

Before downloading, one call to the Hub's repo API tells whether the Hub answers: where it does not (no network,
a firewall), the cache alone is read at once, instead of after ``hf_hub_download``'s retries. ``--repo`` and
``--revision`` are checked before that call, and each download keeps a minimum pace (utils/hub.py, shared with
``hf://`` checkpoints).

Each CSV is checked against the hash the Hub gave for it, which names its blob in the cache (``blobs/<hash>``: the
SHA-256 of an LFS file, the git blob id of a small one), whether it was just downloaded or found in the cache: a
blob damaged since (cut short, edited) is refused, as is an answer whose bytes do not have the hash announced, and
two files announced with one hash (the test split would silently be the training CSV).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx2
from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError, RemoteEntryNotFoundError,
                                    RepositoryNotFoundError, RevisionNotFoundError)
from tqdm import tqdm

from utils.data.puzzle_dataset import DatasetError
from utils.hub import (DownloadTooSlow, hub_answers, odd_answers_as, prepare_client, repo_problem,
                       revision_problem)

CSV_FILES = ("train.csv", "test.csv")


@dataclass(frozen=True)
class FetchedCsvs:
    """The CSVs of one commit of a dataset repo in the Hugging Face cache.

    ``directory`` holds them (the cache's snapshot folder of ``record["commit"]``); ``record`` is what the
    dataset's ``dataset.json`` keeps under ``source``: ``{"repo", "revision", "commit", "files": {name: {"sha256",
    "rows"}}}`` (rows: the CSV's records after its header, blank lines not counted)."""

    directory: Path
    record: dict

    def summary(self) -> str:
        """One line: the repo, the revision and commit, and each file's SHA-256 and row count."""
        files = "; ".join(f"{name} sha256 {f['sha256']}, {f['rows']} rows" for name, f in self.record["files"].items())
        return (f"source: {self.record['repo']} revision {self.record['revision']} = commit {self.record['commit']}: "
                f"{files} (cached in {self.directory})")


def fetch_csvs(repo: str, revision: str | None = None, files: tuple[str, ...] = CSV_FILES) -> FetchedCsvs:
    """Fetch ``files`` of the dataset repo ``repo`` at ``revision`` (a branch, tag or commit; None: ``main``) into
    the Hugging Face cache, or find them there, with a download progress bar.

    Raises:
        DatasetError: one line for each way it fails, before any request for a ``repo`` or ``revision`` that cannot
            name a repo or a branch, tag or commit; then no such repo or revision, a file the repo lacks, an answer
            the Hub refused or that is not a Hub's, a download under the pace it must keep, a file whose bytes do not
            have the hash the Hub gave (or two files with one hash), or the Hub out of reach (or
            ``HF_HUB_OFFLINE=1``) with the cache lacking a file; the last names the two ways forward: a machine with
            network, or ``--source-dir``.
    """
    check_repo_and_revision(repo, revision)
    revision = revision or constants.DEFAULT_REVISION
    prepare_client()
    offline = constants.is_offline_mode() or not _hub_answers(repo, revision)
    first = _download(repo, files[0], revision, offline, revision)
    commit = first.parent.name  # the cache keeps a commit's files in snapshots/<commit>/
    pinned = revision if revision == commit else f"{revision} (commit {commit})"
    paths = [first] + [_download(repo, name, commit, offline, pinned) for name in files[1:]]
    summaries = {path.name: csv_summary(path) for path in paths}
    announced = [check_announced_hash(path, summaries[path.name]["sha256"]) for path in paths]
    announced = [h for h in announced if h is not None]
    if len(set(announced)) < len(announced):
        raise DatasetError(f"the Hub ({constants.ENDPOINT}) gave {' and '.join(files)} of the dataset repo {repo} at "
                           f"revision {pinned} one hash: the splits would be the same file; check HF_ENDPOINT (a "
                           "mirror or proxy may be answering for the Hub), or pass --source-dir DIR with your copy")
    record = {"repo": repo, "revision": revision, "commit": commit, "files": summaries}
    return FetchedCsvs(first.parent, record)


def check_repo_and_revision(repo: str, revision: str | None) -> None:
    """Refuse a ``--repo`` that cannot name a Hub repo and a ``--revision`` that cannot name a branch, tag or commit
    (utils/hub.py), before any request.

    Raises:
        DatasetError: naming the flag, the value and what it must be.
    """
    problem = repo_problem(repo)
    if problem:
        raise DatasetError(f"--repo {repo!r} cannot name a Hugging Face Hub repo ({problem}): e.g. "
                           "--repo sapientinc/sudoku-extreme")
    problem = revision is not None and revision_problem(revision)
    if problem:
        raise DatasetError(f"--revision {revision!r} cannot name a branch, tag or commit ({problem}): give one of the "
                           "repo's, e.g. --revision main")


def check_announced_hash(path: Path, sha256: str) -> str | None:
    """The hash the Hub gave for the cached file ``path``, after checking that its bytes (whose SHA-256 is
    ``sha256``) have it; None where the cache keeps no such record (a file system without symbolic links, where
    huggingface_hub copies the blob into the snapshot).

    The cache names a file's blob by the Hub's ``ETag`` for it (``snapshots/<commit>/<name>`` links to
    ``blobs/<hash>``): 64 hex digits, the SHA-256 of an LFS file, or 40, the git blob id of a small file.

    Raises:
        DatasetError: the bytes do not have that hash (a blob damaged in the cache, or an answer whose bytes are not
            the ones announced), or the name is no hash: naming the blob and what to do.
    """
    if not path.is_symlink():
        return None
    blob = path.resolve()
    announced = blob.name
    if len(announced) == 64:
        actual = sha256
    else:
        with open(blob, "rb") as f:
            actual = hashlib.file_digest(f, lambda: _git_blob_hash(blob)).hexdigest()
    if actual != announced:
        raise DatasetError(f"{path.name} in the Hugging Face cache ({blob}) does not have the hash the Hub gave for it "
                           f"(its name; the bytes give {actual}): it was damaged in the cache, or the answer was not "
                           f"the file announced; delete {blob} and rerun with the Hub in reach to fetch it again, or "
                           "pass --source-dir DIR with your own copy")
    return announced


def _git_blob_hash(path: Path):
    """A SHA-1 fed git's blob header for the file ``path``: with the file's bytes after it, its git blob id."""
    digest = hashlib.sha1()
    digest.update(b"blob %d\0" % path.stat().st_size)
    return digest


def csv_summary(path: Path) -> dict:
    """``{"sha256": hex digest of the file's bytes, "rows": non-blank lines after the first}`` of a CSV file."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        f.seek(0)
        lines = sum(1 for line in f if line.strip())
    return {"sha256": digest, "rows": max(lines - 1, 0)}


def _hub_answers(repo: str, revision: str) -> bool:
    """:func:`utils.hub.hub_answers` for the dataset repo ``repo`` at ``revision``.

    Raises:
        DatasetError: the Hub says there is no such repo or revision.
    """
    try:
        with odd_answers_as(_not_a_hub(repo)):
            return hub_answers(repo, "dataset", revision)
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise _missing(repo, revision, e) from None


def _not_a_hub(repo: str) -> Callable[[str], DatasetError]:
    """The error for an answer about the dataset repo ``repo`` that is not a Hub's (utils.hub.odd_answers_as)."""
    return lambda why: DatasetError(f"the dataset repo {repo}: {why}; or pass --source-dir DIR with a local copy of "
                                    "the CSVs")


def _download(repo: str, name: str, revision: str, offline: bool, shown: str) -> Path:
    """``name`` of the dataset repo at ``revision``, in the cache (``offline``: from the cache only); messages name
    the revision as ``shown``.

    Raises:
        DatasetError: as :func:`fetch_csvs`.
    """
    try:
        # A plain tqdm bar, as the builders' own: shown in a log too, where huggingface_hub's own class hides it.
        with odd_answers_as(_not_a_hub(repo)):  # before the cache's lack is taken for an unreachable Hub
            return Path(hf_hub_download(repo, name, repo_type="dataset", revision=revision, local_files_only=offline,
                                        tqdm_class=tqdm))
    except DownloadTooSlow as e:
        raise DatasetError(f"fetching {name} of the dataset repo {repo} at revision {shown}: {e}; rerun on a faster "
                           "connection, or download the CSVs and pass --source-dir DIR") from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise _missing(repo, shown, e) from None
    except RemoteEntryNotFoundError:
        raise DatasetError(f"the dataset repo {repo} at revision {shown} has no {name}: it must hold "
                           f"{' and '.join(CSV_FILES)}; check --repo and --revision, or pass --source-dir DIR with "
                           "your own copy") from None
    except LocalEntryNotFoundError:
        offline_set = constants.is_offline_mode()
        why = ("HF_HUB_OFFLINE=1 is set" if offline_set
               else f"the Hugging Face Hub ({constants.ENDPOINT}) cannot be reached")
        raise DatasetError(f"{why} and the Hugging Face cache ({constants.HF_HUB_CACHE}) lacks {name} of the dataset "
                           f"repo {repo} at revision {shown}: run this build once on a machine with network"
                           f"{' and without HF_HUB_OFFLINE' if offline_set else ''} (the CSVs stay cached for offline "
                           "reruns), or download the CSVs and pass --source-dir DIR") from None
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as e:  # a refused or broken download, a full disk
        reason = " ".join(str(e).split())
        raise DatasetError(f"could not fetch {name} of the dataset repo {repo} at revision {shown}: {reason}; "
                           "rerun, or pass --source-dir DIR with a local copy") from None


def _missing(repo: str, revision: str, error: Exception) -> DatasetError:
    if isinstance(error, RevisionNotFoundError):
        return DatasetError(f"the dataset repo {repo} has no revision {revision!r}: give --revision a branch, tag or "
                            "commit of it")
    return DatasetError(f"no dataset repo {repo} on the Hugging Face Hub ({constants.ENDPOINT}): check --repo (a "
                        "private or gated one needs `hf auth login`), or pass --source-dir DIR with a local copy")
