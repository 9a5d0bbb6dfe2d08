"""The published puzzle CSVs on the Hugging Face Hub, fetched as the reference builders fetch them.

``sapientinc/HRM``'s ``dataset/build_sudoku_dataset.py`` and ``build_maze_dataset.py`` read
``hf_hub_download(source_repo, f"{set_name}.csv", repo_type="dataset")``. :func:`fetch_csvs` does the same into the
Hugging Face cache (``HF_HOME``, ``HF_HUB_CACHE``), so a second build, or one with ``HF_HUB_OFFLINE=1``, reads the
cache and needs no network; the builders then read the cached files exactly as they read ``--source-dir``. The
first file is fetched at the revision asked for (which records it in the cache's refs, for offline reruns), the
others at the commit it resolved to, so every CSV comes from one commit.

Before downloading, one call to the Hub's repo API tells whether the Hub answers: where it does not (no network,
a firewall), the cache alone is read at once, instead of after ``hf_hub_download``'s retries.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_download
from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError, RemoteEntryNotFoundError,
                                    RepositoryNotFoundError, RevisionNotFoundError)
from tqdm import tqdm

from utils.data.puzzle_dataset import DatasetError

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
        DatasetError: one line for each way it fails: no such repo or revision, a file the repo lacks, an answer
            the Hub refused, or the Hub out of reach (or ``HF_HUB_OFFLINE=1``) with the cache lacking a file; the
            last names the two ways forward: a machine with network, or ``--source-dir``.
    """
    revision = revision or constants.DEFAULT_REVISION
    offline = constants.is_offline_mode() or not _hub_answers(repo, revision)
    first = _download(repo, files[0], revision, offline, revision)
    commit = first.parent.name  # the cache keeps a commit's files in snapshots/<commit>/
    pinned = revision if revision == commit else f"{revision} (commit {commit})"
    paths = [first] + [_download(repo, name, commit, offline, pinned) for name in files[1:]]
    record = {"repo": repo, "revision": revision, "commit": commit,
              "files": {path.name: csv_summary(path) for path in paths}}
    return FetchedCsvs(first.parent, record)


def csv_summary(path: Path) -> dict:
    """``{"sha256": hex digest of the file's bytes, "rows": non-blank lines after the first}`` of a CSV file."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        f.seek(0)
        lines = sum(1 for line in f if line.strip())
    return {"sha256": digest, "rows": max(lines - 1, 0)}


def _hub_answers(repo: str, revision: str) -> bool:
    """Whether the Hub answers for the dataset repo ``repo`` at ``revision`` (False: out of reach or failing).

    Raises:
        DatasetError: the Hub says there is no such repo or revision.
    """
    try:
        HfApi().repo_info(repo, repo_type="dataset", revision=revision, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise _missing(repo, revision, e) from None
    except (httpx2.TransportError, HfHubHTTPError):  # no network, a proxy or firewall, the Hub down: try the cache
        return False
    return True


def _download(repo: str, name: str, revision: str, offline: bool, shown: str) -> Path:
    """``name`` of the dataset repo at ``revision``, in the cache (``offline``: from the cache only); messages name
    the revision as ``shown``.

    Raises:
        DatasetError: as :func:`fetch_csvs`.
    """
    try:
        # Plain tqdm, as the builders' own bars: shown in a log too, where huggingface_hub's own class hides it.
        return Path(hf_hub_download(repo, name, repo_type="dataset", revision=revision, local_files_only=offline,
                                    tqdm_class=tqdm))
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
