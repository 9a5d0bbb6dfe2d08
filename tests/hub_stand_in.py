"""A stand-in for the Hugging Face Hub on 127.0.0.1: the HTTP API as far as ``huggingface_hub`` 2.x uses it to
download files (``hf_hub_download``), describe a repo (``HfApi.repo_info``) and list its files
(``HfApi.list_repo_files``), so tests drive the real client with ``HF_ENDPOINT`` pointing here and never reach the
internet.

Routes, as the Hub serves them:

- ``HEAD``/``GET /{prefix}{owner}/{name}/resolve/{revision}/{path}`` (prefix ``datasets/`` or ``spaces/``, none for
  models): a file at a branch, tag or commit. Every answer carries ``X-Repo-Commit``. A small file is served here
  with its git blob id as ``ETag``; a file over ``INLINE_MAX`` bytes is an LFS file: a ``302`` to the CDN origin (a
  second port, so the client does not follow it with its HEAD) with ``X-Linked-Etag`` (its SHA-256) and
  ``X-Linked-Size``, which ``hf_hub_download`` reads off the redirect before it GETs the CDN's URL. A repo, revision
  or file that is not there is a ``404`` with the Hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
  ``EntryNotFound``), which the client turns into its typed errors.
- ``GET /api/{type}s/{owner}/{name}[/revision/{revision}]``: the repo's id, commit (``sha``) and files.
- ``GET /api/{type}s/{owner}/{name}/tree/{revision}[/{path}]``: its files, one page.
- CDN ``GET``/``HEAD /blobs/{sha256}?filename=...``: an LFS file's bytes, named in ``Content-Disposition`` (the
  name the client's progress bar shows).

It misbehaves on purpose as a mirror, a proxy or a wrong ``HF_ENDPOINT`` may (:class:`Faults`): it serves any
revision, drips its files' bytes, announces files with one ETag or without ``X-Repo-Commit``, names a commit that is
no folder name, or lists a repo's files in a body the client cannot read. :func:`silent_endpoint` accepts connections
and never answers; :func:`closed_endpoint` refuses them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import parse_qs, quote, unquote, urlsplit

from huggingface_hub import constants, hf_hub_url

INLINE_MAX = 1024  # bytes; larger files are LFS files, served through the CDN as the Hub serves them
PREFIXES = {"datasets": "dataset", "spaces": "space"}


@dataclass
class Repo:
    """One repository: its commits (commit -> {path: bytes}) and refs (branch or tag -> commit)."""

    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)

    def commit_of(self, revision: str) -> Optional[str]:
        return self.refs.get(revision) or (revision if revision in self.commits else None)


@dataclass
class Faults:
    """What the stand-in does that the Hub does not (all off by default).

    Attributes:
        any_revision: a revision it does not have is served as ``main`` (a permissive endpoint), in the file and the
            repo API alike.
        drip_s: seconds between the bytes of a file's body (the Hub's answer and the CDN's).
        etag: every file is announced with this ETag (and ``X-Linked-Etag``), whatever its bytes.
        commit: every file answer carries this ``X-Repo-Commit`` ("" leaves the header out).
        tree: the body of every file listing (``/api/.../tree/...``).
    """

    any_revision: bool = False
    drip_s: float = 0.0
    etag: Optional[str] = None
    commit: Optional[str] = None
    tree: Optional[bytes] = None


class HubStandIn:
    """The stand-in Hub: publish repos, then ``start()`` it (or use it as a context manager); ``endpoint`` is its
    ``HF_ENDPOINT``. ``requests`` records ``(method, path)`` of every request it answered; ``faults`` says how it
    misbehaves."""

    def __init__(self, faults: Optional[Faults] = None):
        self.faults = faults or Faults()
        self.repos: dict[tuple[str, str], Repo] = {}
        self.blobs: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self._servers: list[ThreadingHTTPServer] = []

    def publish(self, repo_type: str, repo_id: str, files: dict[str, bytes], *, branch: str = "main",
                tags: tuple[str, ...] = ()) -> str:
        """Commit ``files`` (the whole tree) to ``branch`` of the ``repo_type`` repo ``repo_id`` and point ``tags``
        at it; returns the commit's 40-hex id."""
        repo = self.repos.setdefault((repo_type, repo_id), Repo())
        digest = hashlib.sha1(f"{repo_type}/{repo_id}/{len(repo.commits)}".encode())
        for path, data in sorted(files.items()):
            digest.update(path.encode() + b"\0" + data)
            self.blobs[hashlib.sha256(data).hexdigest()] = data
        commit = digest.hexdigest()
        repo.commits[commit] = dict(files)
        for ref in (branch, *tags):
            repo.refs[ref] = commit
        return commit

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def env(self, hf_home: Path) -> dict[str, str]:
        """The environment entries that point a ``huggingface_hub`` process here, with its cache in ``hf_home``."""
        return {"HF_ENDPOINT": self.endpoint, "HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_home / "hub"),
                "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}

    def start(self) -> "HubStandIn":
        for handler in (_HubHandler, _CdnHandler):
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            server.daemon_threads = True
            server.stand_in = self
            self._servers.append(server)
            # A short poll: stop() waits for it, twice per stand-in.
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> "HubStandIn":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def silent_endpoint() -> Iterator[tuple[str, list[socket.socket]]]:
    """An ``HF_ENDPOINT`` on 127.0.0.1 that accepts connections and never answers (a Hub behind a firewall that
    drops its answers, a hung proxy), and the connections it accepted so far."""
    accepted: list[socket.socket] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()

        def accept():
            with contextlib.suppress(OSError):  # the listening socket closed: the test is over
                while True:
                    accepted.append(server.accept()[0])

        threading.Thread(target=accept, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
        finally:
            for connection in accepted:
                connection.close()


def point_at(monkeypatch, endpoint: str, cache: Path, offline: bool = False) -> None:
    """Point this process's huggingface_hub at ``endpoint`` with its cache in ``cache`` (it reads HF_ENDPOINT when
    imported, so its constants are set along with the environment), without telemetry, as :meth:`HubStandIn.env`
    (with it, huggingface_hub asks the endpoint for its list of AI agents once a process, before the first request)."""
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    assert hf_hub_url("owner/repo", "file", repo_type="dataset").startswith(endpoint + "/")  # never the real Hub


def closed_endpoint() -> str:
    """An ``HF_ENDPOINT`` on 127.0.0.1 where nothing listens (a port just bound and released): connections are
    refused at once, as where the Hub cannot be reached."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes, which the Hub sends as a small file's ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def hub(self) -> HubStandIn:
        return self.server.stand_in

    def log_message(self, *args) -> None:  # the tests read the answers, not a log on stderr
        pass

    def do_HEAD(self) -> None:
        self.hub.requests.append(("HEAD", self.path))
        self.route(head=True)

    def do_GET(self) -> None:
        self.hub.requests.append(("GET", self.path))
        self.route(head=False)

    def answer(self, status: int, headers: dict[str, str], body: bytes = b"", head: bool = False,
               length: Optional[int] = None, drip: bool = False) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if head:
            return
        if not (drip and self.hub.faults.drip_s):
            self.wfile.write(body)
            return
        with contextlib.suppress(OSError):  # the client hung up
            for i in range(len(body)):
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
                time.sleep(self.hub.faults.drip_s)

    def error(self, code: str, head: bool, extra: Optional[dict[str, str]] = None) -> None:
        body = json.dumps({"error": code}).encode()
        self.answer(404, {"X-Error-Code": code, "Content-Type": "application/json", **(extra or {})}, body, head)


class _HubHandler(_Handler):
    def route(self, head: bool) -> None:
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        if parts[0] == "api":
            self.api(parts[1:], head)
        else:
            self.resolve(parts, head)

    def repo(self, repo_type: str, parts: list[str], head: bool) -> Optional[Repo]:
        repo = self.hub.repos.get((repo_type, "/".join(parts[:2])))
        if repo is None:
            self.error("RepoNotFound", head)
        return repo

    def commit(self, repo: Repo, revision: str, head: bool) -> Optional[str]:
        commit = repo.commit_of(revision) or (repo.refs["main"] if self.hub.faults.any_revision else None)
        if commit is None:
            self.error("RevisionNotFound", head)
        return commit

    def resolve(self, parts: list[str], head: bool) -> None:
        repo_type = PREFIXES.get(parts[0], "model")
        parts = parts[1:] if parts[0] in PREFIXES else parts
        if len(parts) < 5 or parts[2] != "resolve":
            return self.error("RepoNotFound", head)
        repo = self.repo(repo_type, parts, head)
        commit = repo and self.commit(repo, parts[3], head)
        if commit is None:
            return
        path = "/".join(parts[4:])
        data = repo.commits[commit].get(path)
        if data is None:
            return self.error("EntryNotFound", head, {"X-Repo-Commit": commit})
        faults = self.hub.faults
        shown = {"X-Repo-Commit": commit if faults.commit is None else faults.commit}
        shown = {name: value for name, value in shown.items() if value}
        if len(data) > INLINE_MAX:
            sha256 = hashlib.sha256(data).hexdigest()
            where = f"{self.hub.cdn}/blobs/{sha256}?filename={quote(path.rsplit('/', 1)[-1])}"
            return self.answer(302, {"Location": where, **shown, "X-Linked-Etag": f'"{faults.etag or sha256}"',
                                     "X-Linked-Size": str(len(data)),
                                     "ETag": f'"{faults.etag or git_blob_id(data)}"'}, head=head)
        self.answer(200, {**shown, "ETag": f'"{faults.etag or git_blob_id(data)}"',
                          "Content-Type": "application/octet-stream"}, data, head, drip=True)

    def api(self, parts: list[str], head: bool) -> None:
        repo_type = parts[0].removesuffix("s") if parts else ""
        repo = self.repo(repo_type, parts[1:], head)
        if repo is None:
            return
        rest = parts[3:]
        revision = rest[1] if len(rest) >= 2 and rest[0] in ("revision", "tree") else "main"
        commit = self.commit(repo, revision, head)
        if commit is None:
            return
        files = repo.commits[commit]
        if rest and rest[0] == "tree":
            under = "/".join(rest[2:])
            listing = [{"type": "file", "path": path, "size": len(data), "oid": git_blob_id(data)}
                       for path, data in sorted(files.items()) if path.startswith(under)]
            body = json.dumps(listing).encode() if self.hub.faults.tree is None else self.hub.faults.tree
        else:
            body = json.dumps({"id": "/".join(parts[1:3]), "sha": commit, "private": False,
                               "siblings": [{"rfilename": path} for path in sorted(files)]}).encode()
        self.answer(200, {"Content-Type": "application/json"}, body, head)


class _CdnHandler(_Handler):
    def route(self, head: bool) -> None:
        parts = urlsplit(self.path).path.strip("/").split("/")
        data = self.hub.blobs.get(parts[-1]) if parts[0] == "blobs" else None
        if data is None:
            return self.answer(404, {}, b"", head)
        name = parse_qs(urlsplit(self.path).query).get("filename", ["file"])[0]
        self.answer(200, {"Content-Type": "application/octet-stream", "ETag": f'"{parts[-1]}"',
                          "Content-Disposition": f'inline; filename="{name}"'}, data, head, drip=True)
