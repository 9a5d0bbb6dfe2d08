"""The page's HTTP layer and its security checks: the addresses it answers (Host, Origin, the token of a non-local
--host), connection and request bounds, and the handler of its endpoints (utils/serve/server.py)."""


from __future__ import annotations

import contextlib
import errno
import hmac
import ipaddress
import json
import logging
import re
import secrets
import select
import socket
import sys
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator, Optional
from urllib.parse import parse_qs, urlsplit


from utils.errors import RunFailure, UserError
from utils.run.main import one_line
from utils.eval.reasoning import Cancelled

from utils.serve.fields import checked_solve_id, parse_request
from utils.serve.solves import Solver

log = logging.getLogger(__name__)
PAGE = Path(__file__).with_name("page.html")
MAX_BODY = 1 << 20  # a 30x30 ARC task with its demonstrations is a few tens of kB
TOKEN_HEADER = "X-Page-Token"
CONNECTION_TIMEOUT_S = 30  # a client silent this long (mid-request, or not reading its answer) is hung up on
REQUEST_DEADLINE_S = 60  # a request's headers and body arrive within this, however slowly they trickle
MAX_CONNECTIONS = 64  # connections served at once, each a thread
# Connections served at once from one address (an IPv6 /64), counted as they arrive, before any request is read: a
# page in a browser opens at most 6, and a client that holds more (slowly sending nothing) keeps the rest of the
# MAX_CONNECTIONS free for everyone else.
PEER_CONNECTIONS = 8
# Solves running or waiting for their turn from one address: fewer than PEER_CONNECTIONS, so that a client whose solves
# wait still has connections left to stop them and watch them (the next solve gets a 429).
PEER_SOLVES = PEER_CONNECTIONS - 2


def netloc(name: str, port: int) -> str:
    """``name:port`` as a ``Host`` header writes it (an IPv6 address in brackets)."""
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


@dataclass(frozen=True)
class Access:
    """Who may use the page (:func:`access_for`): the ``Host`` values it answers (None: any but an unspecified address,
    the token guarding it), the ``token`` each request carries (None: on loopback), the page's ``url``, and the
    ``warning`` a non-loopback address gets."""

    hosts: Optional[frozenset[str]]
    token: Optional[str]
    url: str
    warning: Optional[str]

    def host_ok(self, host: str) -> bool:
        """Whether ``host`` (a ``Host`` header, ``name:port``) is one the page answers."""
        if self.hosts is not None:
            return host in self.hosts
        try:
            name = urlsplit(f"//{host}").hostname or ""
        except ValueError:  # an unbalanced [
            return False
        address = spelled_address(name)
        return bool(name) if address is None else not address.is_unspecified

    def origin_ok(self, origin: str, host: str) -> bool:
        """Whether a browser's ``Origin`` is the page itself (its address, as the ``Host`` it sent)."""
        try:
            where = urlsplit(origin).netloc
        except ValueError:  # an unbalanced [
            return False
        return where in self.hosts if self.hosts is not None else where == host


# One part of an IPv4 address as inet_aton reads it, and browsers (the WHATWG URL standard) and curl with it: hex after
# 0x (0x alone: 0), octal after a leading 0, else decimal.
_IPV4_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")


def spelled_address(name: str) -> Optional[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The IP address that ``name`` (a URL's host, IPv6 without its brackets) spells; None for a name.

    Besides the standard forms, the IPv4 forms that inet_aton takes, and browsers and curl with it: one to four
    parts, each decimal, octal (a leading 0) or hex (0x), the last filling the bytes the others leave (``0``,
    ``0x0``, ``0.0``, ``00.0.0.0``, ``127.1``), with one trailing dot allowed. An IPv4-mapped IPv6 address
    (``::ffff:0.0.0.0``) is the IPv4 address it maps: a connection to it goes there.
    """
    try:
        found = ipaddress.ip_address(name)
    except ValueError:
        found = _inet_aton(name)
    return getattr(found, "ipv4_mapped", None) or found


def _inet_aton(name: str) -> Optional[ipaddress.IPv4Address]:
    """The IPv4 address ``name`` spells in one of inet_aton's forms (:func:`spelled_address`); None when it does not."""
    parts = name.removesuffix(".").split(".")
    if not 1 <= len(parts) <= 4 or not all(_IPV4_PART.fullmatch(part) for part in parts):
        return None
    values = [int(part[2:] or "0", 16) if part[:2] in ("0x", "0X") else int(part, 8 if part[0] == "0" else 10)
              for part in parts]
    *leading, last = values
    if any(value > 255 for value in leading) or last >= 256 ** (5 - len(values)):
        return None
    return ipaddress.IPv4Address(sum(value << 8 * (3 - i) for i, value in enumerate(leading)) + last)


def access_for(host: str, bound: str, port: int) -> Access:
    """Who may use a page that ``--host host`` bound to the address ``bound``, port ``port``.

    On loopback, the Host names of this machine (``localhost``, the address, the name given). Elsewhere a token, and
    a warning that names who can reach the page: the address's network, or for 0.0.0.0 (or ``""``, ``::``) every
    network of the machine, whose ``Host`` can be any of its names.
    """
    ip = ipaddress.ip_address(bound.split("%")[0])  # an IPv6 link-local address may carry its %interface
    if ip.is_loopback:
        names = {host, bound, "localhost"} - {""}
        url = f"http://{netloc(bound, port)}/"
        return Access(frozenset(netloc(name, port) for name in names), None, url, None)
    token = secrets.token_urlsafe(16)
    if ip.is_unspecified:
        machine = socket.gethostname()
        addresses = machine_addresses(machine, ip.version)
        reach = f"every network interface of this machine ({', '.join([machine, *addresses])})"
        hosts, where = None, machine
    else:
        reach = bound if host in (bound, "") else f"{host} ({bound})"
        hosts, where = frozenset({netloc(host, port), netloc(bound, port)}), bound
    warning = (f"--host {host or repr(host)} listens on {reach}: anyone who can reach it on port {port} can use the "
               "page and its models, with the token in the address below; --host 127.0.0.1 keeps it to this machine")
    return Access(hosts, token, f"http://{netloc(where, port)}/?token={token}", warning)


def machine_addresses(name: str, version: int) -> list[str]:
    """The addresses (IPv4, or with ``version`` 6 both) that ``name``, this machine's, resolves to, loopback left
    out; empty where it resolves to none."""
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    kept = [info[4][0] for info in found if version == 6 or info[0] == socket.AF_INET]
    return sorted({a for a in kept if not ipaddress.ip_address(a.split("%")[0]).is_loopback})


def listen_address(host: str, port: int) -> tuple[int, tuple]:
    """The socket family and address that ``--host host --port port`` bind (``""``: 0.0.0.0, every interface;
    an IPv4 address first where a name has both).

    Raises:
        UserError: ``host`` names no address.
    """
    try:
        found = socket.getaddrinfo(host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:
        raise UserError(f"--host {host}: no such address ({getattr(e, 'strerror', None) or e}); give an address of "
                        "this machine, such as 127.0.0.1 (this machine only)") from None
    family, _, _, _, address = min(found, key=lambda info: info[0] != socket.AF_INET)
    return family, address


def bind_advice(host: str, port: int, error: OSError) -> str:
    """The one line for a failed bind: the address, why, and what to change (the port only when it is the port)."""
    if error.errno == errno.EADDRINUSE:
        fix = "another program listens there: choose another --port (0 picks a free one)"
    elif error.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        fix = (f"{host} is not an address of this machine{' (or its IPv6 is off)' if ':' in host else ''}: give "
               "one of its addresses, such as 127.0.0.1 (this machine only)")
    elif error.errno == errno.EACCES and 0 < port < 1024:
        fix = "ports below 1024 need administrator rights: choose --port 1024 or above (0 picks a free one)"
    else:
        fix = "choose another --host or --port"
    return f"cannot listen on {netloc(host, port)} ({error.strerror or error}); {fix}"


class Handler(BaseHTTPRequestHandler):
    """The page, ``/api/models`` and ``/api/solve`` of its :class:`PageServer`, each after the Host/Origin (and
    token) check; a connection is hung up on when silent for ``timeout`` seconds or when its request has not arrived
    within :data:`REQUEST_DEADLINE_S`."""

    server: "PageServer"
    server_version = "solve.py"
    timeout = CONNECTION_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self._deadline = threading.Timer(REQUEST_DEADLINE_S, self._hang_up)
        self._deadline.daemon = True
        self._deadline.start()

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def _hang_up(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)  # the blocked read returns: the handler ends
        except OSError:
            pass

    def _client_gone(self) -> bool:
        """Whether the client closed its end (what it may have sent after the request is left unread)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
        except (OSError, ValueError):
            return True

    def log_message(self, format: str, *args) -> None:  # noqa: A002  (the base class's name)
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: HTTPStatus, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _ours(self) -> bool:
        access, host, origin = self.server.access, self.headers.get("Host", ""), self.headers.get("Origin")
        if not access.host_ok(host) or (origin is not None and not access.origin_ok(origin, host)):
            self._json(HTTPStatus.FORBIDDEN, {"error": "this server answers only its own page (Host/Origin is not "
                                                       "its address)"})
            return False
        if access.token is None:
            return True
        given = self.headers.get(TOKEN_HEADER) or parse_qs(self.path.partition("?")[2]).get("token", [""])[0]
        if hmac.compare_digest(given.encode(), access.token.encode()):
            return True
        self._json(HTTPStatus.FORBIDDEN, {"error": "this page needs its token: open the address solve.py --serve "
                                                   "printed, with its ?token=..."})
        return False

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        self._deadline.cancel()
        with self.server.answering():
            self._get()

    def _get(self) -> None:
        if not self._ours():
            return
        path = self.path.partition("?")[0]
        if path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, PAGE.read_bytes(), "text/html; charset=utf-8")
        elif path == "/api/models":
            solver = self.server.solver
            self._json(HTTPStatus.OK, {"models": [m.describe(solver.device, solver.args) for m in solver.models]})
        elif path == "/api/progress":
            try:
                solve_id = checked_solve_id(parse_qs(self.path.partition("?")[2]).get("solve", [None])[0], "solve")
            except UserError as e:
                return self._json(HTTPStatus.BAD_REQUEST, {"error": one_line(e)})
            self._json(HTTPStatus.OK, self.server.solver.progress(solve_id))
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path}"})

    def do_POST(self) -> None:  # noqa: N802
        with self.server.answering():
            self._post()

    def _post(self) -> None:
        if not self._ours():
            return
        path = self.path.partition("?")[0]
        if path not in ("/api/solve", "/api/stop"):
            return self._json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {path}"})
        if self.headers.get_content_type() != "application/json":
            return self._json(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": "send the request as application/json"})
        if self.headers.get("Content-Length") is None:  # a chunked body, say: its size is not known before it is read
            return self._json(HTTPStatus.LENGTH_REQUIRED, {"error": "send the request with its Content-Length (at most "
                                                                    f"{MAX_BODY} bytes), not in chunks"})
        try:
            length = int(self.headers.get("Content-Length", "-1"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            return self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                              {"error": f"a request is at most {MAX_BODY} bytes"})
        body = self.rfile.read(length)
        self._deadline.cancel()
        if len(body) < length:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": f"the request ended after {len(body)} of the "
                                                                f"{length} bytes its Content-Length announced"})
        try:
            request = parse_request(body)
        except UserError as e:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": one_line(e)})
        if path == "/api/stop":
            return self._stop(request)
        with self.server.solving(peer(self.client_address)) as admitted:
            if not admitted:
                return self._json(HTTPStatus.TOO_MANY_REQUESTS,
                                  {"error": f"this address has {PEER_SOLVES} solves running or waiting for their "
                                            "turn: stop one, or wait for one to end"})
            self._solve(request)

    def _stop(self, request: Any) -> None:
        try:
            solve_id = checked_solve_id(request.get("solve") if isinstance(request, dict) else None, "solve")
        except UserError as e:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": one_line(e)})
        self._json(HTTPStatus.OK, {"stopping": self.server.solver.stop(solve_id)})

    def _solve(self, request: Any) -> None:
        solver = self.server.solver
        try:
            payload = solver.solve(request, self._client_gone)
        except Cancelled:
            if solver.stopping.is_set():
                self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "the server is stopping: this solve was "
                                                                     "cancelled"})
            return  # else the client left: no one to answer
        except (UserError, RunFailure) as e:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": one_line(e)})
        except Exception as e:  # a bug: the page says so, the terminal keeps the traceback
            log.exception("solving failed")
            return self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error ({type(e).__name__}: "
                                                                          f"{one_line(e)}); the terminal has the "
                                                                          "details"})
        self._json(HTTPStatus.OK, payload)


class PageServer(ThreadingHTTPServer):
    """The bound server, its :class:`Solver` and :class:`Access`; ``url`` is the page's address. At most
    :data:`MAX_CONNECTIONS` connections are served at once (``open_connections``), at most :data:`PEER_CONNECTIONS`
    of them from one address (:func:`peer`), and at most :data:`PEER_SOLVES` solves from one address run or wait
    (:meth:`solving`); a client that leaves early is logged at debug level, not as an error."""

    daemon_threads = True  # a stuck client never keeps the process alive; serve() waits for the solve itself

    def __init__(self, solver: Solver, host: str, port: int):
        self.address_family, address = listen_address(host, port)
        self.solver = solver
        self.open_connections = 0
        self._peers: dict[str, int] = {}  # open connections by peer
        self._solving: dict[str, int] = {}  # solves running or waiting by peer
        self._count = threading.Lock()
        self._answering: set[threading.Thread] = set()  # handlers between a request and its answer
        self._answered = threading.Condition()
        self._interrupted: Optional[BaseException] = None  # see service_actions
        super().__init__(address, Handler)
        bound, port = self.server_address[:2]
        self.access = access_for(host, bound, port)
        self.url = self.access.url

    def process_request(self, request, client_address) -> None:
        who = peer(client_address)
        with self._count:
            busy = self._busy(who)
            if busy is None:
                self.open_connections += 1
                self._peers[who] = self._peers.get(who, 0) + 1
        if busy is not None:
            busy_reply(request, busy)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:  # its thread did not start
            self._leave(who)
            raise
        except BaseException as interrupt:  # Ctrl-C or SIGTERM while start() waits for the thread
            # The thread runs: it answers, closes its connection and counts it off itself. Raised from here, the
            # interrupt would make socketserver close the connection under it (the client got no answer, not even
            # the 503 of a cancelled solve), so serve_forever raises it next, from service_actions.
            self._interrupted = interrupt

    def service_actions(self) -> None:
        """Raise the interrupt that landed while a connection's thread started (:meth:`process_request`), so that
        it reaches serve() once socketserver is done with that connection."""
        interrupt, self._interrupted = self._interrupted, None
        if interrupt is not None:
            raise interrupt

    def _busy(self, who: str) -> Optional[str]:
        """Why a new connection from ``who`` is not served now (the caller holds the count's lock); None: it is."""
        if self._peers.get(who, 0) >= PEER_CONNECTIONS:
            return (f"this address has {PEER_CONNECTIONS} connections to the page open already: try again when one "
                    "ends")
        if self.open_connections >= MAX_CONNECTIONS:
            return f"the page serves {MAX_CONNECTIONS} connections already: try again when one ends"
        return None

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._leave(peer(client_address))

    def _leave(self, who: str) -> None:
        with self._count:
            self.open_connections -= 1
            self._peers[who] -= 1
            if not self._peers[who]:
                del self._peers[who]

    @contextlib.contextmanager
    def solving(self, who: str) -> Iterator[bool]:
        """``with``: a solve from ``who`` runs or waits until the block ends; yields whether it may (False: ``who``
        has :data:`PEER_SOLVES` already, and this one is not counted)."""
        with self._count:
            admitted = self._solving.get(who, 0) < PEER_SOLVES
            if admitted:
                self._solving[who] = self._solving.get(who, 0) + 1
        try:
            yield admitted
        finally:
            if admitted:
                with self._count:
                    self._solving[who] -= 1
                    if not self._solving[who]:
                        del self._solving[who]

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """``with``: the calling handler is answering a request (read whole or in part) until the block ends."""
        with self._answered:
            self._answering.add(threading.current_thread())
        try:
            yield
        finally:
            with self._answered:
                self._answering.discard(threading.current_thread())
                self._answered.notify_all()

    def wait_answered(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no handler is answering a request; whether none is. Connections
        still waiting for a request are not waited for: nothing has been asked of them."""
        with self._answered:
            return self._answered.wait_for(lambda: not self._answering, timeout)

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):  # the client left, or stopped reading
            log.debug("%s: %s", client_address, error)
        else:
            log.error("a request from %s failed", client_address, exc_info=True)


def peer(client_address: tuple) -> str:
    """Whose a connection from ``client_address`` is, for :data:`PEER_CONNECTIONS`: its IPv4 address (also when
    IPv4-mapped), or the /64 network of an IPv6 one, which one machine commonly holds whole."""
    address = ipaddress.ip_address(client_address[0].split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(getattr(address, "ipv4_mapped", None) or address)


def busy_reply(connection: socket.socket, why: str) -> None:
    """Tell a connection that is not served now (a peer's or the page's connections are all in use) so, ``why``, with
    a 503, without waiting on it."""
    body = json.dumps({"error": why}).encode()
    head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    try:
        connection.settimeout(1)
        connection.sendall(head + body)
    except OSError:
        pass
