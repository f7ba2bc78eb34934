"""Running the aiomoqt side: the interop venv, a test PKI and token issuer, peer subprocesses.

Every subprocess is bounded: it runs in its own process group (``start_new_session``), each wait on it
has a timeout, and :meth:`PeerProcess.stop` sends SIGTERM to the group, then SIGKILL after a grace
period, so a test leaves no process behind whatever happened. Peer output is read continuously (a
chatty relay never blocks on a full pipe); the last lines are kept for failure messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Final, Literal, TypeAlias, TypeVar

from cryptography.hazmat.primitives.asymmetric import ec

from control.deploy import ports
from interop.content import BlockSpec
from kvsp.pki import RoleSpec, make_dev_pki
from moqt.auth import issue_token

REPO: Final = Path(__file__).resolve().parents[1]
PEERS: Final = REPO / "interop" / "peers"
AIOMOQT_VERSION: Final = "0.13.3"
AIOMOQT_DEFAULT_DRAFTS: Final = (22, 20, 18, 16, 14)  # aiomoqt.types.MOQT_DEFAULT_DRAFTS: its default offer
VENV: Final = REPO / ".venv-interop"
PYTHON_ENV: Final = "KVSP_INTEROP_PYTHON"
PREFIX: Final = "@interop "
_TAIL_LINES: Final = 60
_LINE_LIMIT: Final = 64 << 20  # a result line carries every payload in hex
T = TypeVar("T")


def interop_python() -> Path | None:
    """The interop venv's interpreter (``$KVSP_INTEROP_PYTHON`` or ``.venv-interop``), if it exists."""
    configured = os.environ.get(PYTHON_ENV)
    path = Path(configured) if configured else VENV / "bin" / "python"
    return path if path.is_file() else None


class InteropUnavailable(RuntimeError):
    """The interop venv could not be had on this machine; the message says why (for a skip reason)."""


_ENV_SCRIPT: Final = REPO / ".ci" / "interop-env"
_ENV_BUILD_TIMEOUT_S: Final = 900.0
_ENV_LOCK: Final = REPO / ".venv-interop.lock"


@functools.cache
def ensure_interop_python() -> Path:
    """The interop interpreter, building ``.venv-interop`` with ``.ci/interop-env`` when it is absent or stale.

    So that the README's test command alone runs the third-party interop. An interpreter named by
    ``$KVSP_INTEROP_PYTHON`` is used as it is. Raises :class:`InteropUnavailable` (see
    :func:`build_interop_venv`) when it cannot be had.
    """
    if os.environ.get(PYTHON_ENV):
        configured = interop_python()
        if configured is None:
            raise InteropUnavailable(f"${PYTHON_ENV} names {os.environ[PYTHON_ENV]!r}, which does not exist")
        return configured
    return build_interop_venv()


def build_interop_venv(venv: Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """Run ``.ci/interop-env`` (for ``venv``, default ``.venv-interop``) and return the interpreter it prints.

    The script reuses a venv that already pins aiomoqt at once, and otherwise creates it from pyenv's
    3.12 (or python3.12/3.13). A file lock keeps two pytest processes from building the same venv at
    once. Raises :class:`InteropUnavailable` with the script's own reason (e.g. no Python >= 3.12 on this
    machine) when it fails.
    """
    environ = dict(os.environ if env is None else env)
    if venv is not None:
        environ["KVSP_INTEROP_VENV"] = str(venv)
    lock_path = _ENV_LOCK if venv is None else venv.with_name(venv.name + ".lock")
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            done = subprocess.run(["bash", str(_ENV_SCRIPT)], cwd=REPO, capture_output=True, text=True,
                                  timeout=_ENV_BUILD_TIMEOUT_S, check=False, env=environ)
        except subprocess.TimeoutExpired as exc:
            raise InteropUnavailable(f".ci/interop-env did not finish in {_ENV_BUILD_TIMEOUT_S:.0f} s") from exc
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        why = lines[-1] if lines else f"exit status {done.returncode}"
        raise InteropUnavailable(f"the interop venv (Python >= 3.12, aiomoqt=={AIOMOQT_VERSION}) cannot be "
                                 f"built on this machine: {why}")
    return Path(done.stdout.strip().splitlines()[-1])


def aiomoqt_version(python: Path) -> str:
    """aiomoqt's installed version in that interpreter (raises if it is not installed)."""
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('aiomoqt'))"],
                         capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.strip()


def free_udp_port() -> int:
    """A UDP port free on every interface right now (aiopquic servers bind 0.0.0.0, not a given host)."""
    return ports.free_udp_port("0.0.0.0")


# -- credentials -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Credentials:
    """A dev CA, a kvsp server certificate, one for the aiomoqt servers, and a token issuer key."""

    directory: Path
    issuer: ec.EllipticCurvePrivateKey

    KVSP_URI: ClassVar[str] = "moqt://127.0.0.1/kvsp"
    AIOMOQT_URI: ClassVar[str] = "moqt://127.0.0.1/aiomoqt"

    @classmethod
    def create(cls, directory: Path) -> Credentials:
        make_dev_pki(directory, [RoleSpec("kvsp", cls.KVSP_URI), RoleSpec("aiomoqt", cls.AIOMOQT_URI)])
        return cls(directory, ec.generate_private_key(ec.SECP256R1()))

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    def cert(self, role: str) -> Path:
        return self.directory / f"{role}.pem"

    def key(self, role: str) -> Path:
        return self.directory / f"{role}.key"

    def token(self, subject: str, scopes: Sequence[bytes], *, key: ec.EllipticCurvePrivateKey | None = None,
              lifetime: int = 300, age: int = 0) -> bytes:
        """A CWT for ``subject`` naming ``scopes``, signed by the issuer (or by ``key``, e.g. a rogue one),
        issued ``age`` seconds ago and valid for ``lifetime`` seconds from then."""
        issued = int(time.time()) - age
        return issue_token(key or self.issuer, subject, scopes, expires_at=issued + lifetime, now=issued)


# -- peer processes --------------------------------------------------------------------------------
class PeerError(RuntimeError):
    """A peer did not report in time, exited early, or reported something malformed."""


@dataclass(frozen=True, slots=True)
class PeerMessage:
    kind: str
    fields: Mapping[str, object]


class PeerProcess:
    """One subprocess, its ``@interop`` messages (stdout) and its other output (kept for diagnostics)."""

    def __init__(self, name: str, argv: Sequence[str]) -> None:
        self.name, self.argv = name, list(argv)
        self.proc: asyncio.subprocess.Process | None = None
        self.output: deque[str] = deque(maxlen=_TAIL_LINES)
        self._messages: asyncio.Queue[PeerMessage] = asyncio.Queue()
        self._line_waiters: list[tuple[str, asyncio.Future[None]]] = []
        self._watched: dict[str, int] = {}
        self._readers: list[asyncio.Task[None]] = []

    async def start(self) -> PeerProcess:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=REPO, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            limit=_LINE_LIMIT)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [asyncio.ensure_future(self._read(self.proc.stdout)),
                         asyncio.ensure_future(self._read(self.proc.stderr))]
        return self

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip("\n")
            if text.startswith(PREFIX):
                try:
                    data = json.loads(text[len(PREFIX):])
                except ValueError:
                    data = None
                if isinstance(data, dict) and isinstance(data.get("kind"), str):
                    self._messages.put_nowait(PeerMessage(data["kind"], data))
                else:
                    self._messages.put_nowait(PeerMessage("error", {"error": f"malformed line {text[:200]!r}"}))
                continue
            self.output.append(text)
            for needle in self._watched:
                if needle in text:
                    self._watched[needle] += 1
            for needle, waiter in self._line_waiters:
                if needle in text and not waiter.done():
                    waiter.set_result(None)

    def watch(self, needle: str) -> None:
        """Count, from now on, the diagnostics lines that contain ``needle`` (see :meth:`seen`); unlike
        :attr:`output`, the count misses nothing however much the peer logs."""
        self._watched.setdefault(needle, 0)

    def seen(self, needle: str) -> int:
        """How many diagnostics lines contained ``needle`` since :meth:`watch`."""
        return self._watched[needle]

    def diagnostics(self) -> str:
        rc = None if self.proc is None else self.proc.returncode
        return f"{self.name} (exit {rc}); last output:\n" + "\n".join(self.output)

    async def expect(self, kind: str, timeout: float) -> PeerMessage:
        """The next message of ``kind`` (others are dropped); PeerError on timeout or early exit."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    get = asyncio.ensure_future(self._messages.get())
                    exited = asyncio.ensure_future(self._exited())
                    done, _ = await asyncio.wait({get, exited}, return_when=asyncio.FIRST_COMPLETED)
                    exited.cancel()
                    if get in done:
                        message = get.result()
                        if message.kind == kind:
                            return message
                        if message.kind == "error":
                            raise PeerError(f"{self.name} failed: {message.fields.get('error')}\n"
                                            + self.diagnostics())
                        continue
                    get.cancel()
                    if self._messages.empty():
                        raise PeerError(f"{self.name} exited before reporting {kind!r}\n{self.diagnostics()}")
        except TimeoutError:
            raise PeerError(f"{self.name}: no {kind!r} within {timeout}s\n{self.diagnostics()}") from None

    async def _exited(self) -> None:
        assert self.proc is not None
        await self.proc.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)  # all output read

    async def wait_for_line(self, needle: str, timeout: float) -> None:
        """Wait until a diagnostics line contains ``needle`` (e.g. a server's "listening")."""
        if any(needle in line for line in self.output):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line_waiters.append((needle, waiter))
        exited = asyncio.ensure_future(self._exited())
        try:
            async with asyncio.timeout(timeout):
                done, _ = await asyncio.wait({waiter, exited}, return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                raise PeerError(f"{self.name} exited before {needle!r}\n{self.diagnostics()}")
        except TimeoutError:
            raise PeerError(f"{self.name}: no {needle!r} within {timeout}s\n{self.diagnostics()}") from None
        finally:
            exited.cancel()
            self._line_waiters.remove((needle, waiter))

    async def stop(self, grace: float = 3.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; returns the exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.returncode is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    async with asyncio.timeout(grace):
                        await proc.wait()
                    break
                except TimeoutError:
                    continue
        with contextlib.suppress(ProcessLookupError):  # children it left in its group, if any
            os.killpg(proc.pid, signal.SIGKILL)
        # The pipes reach EOF once the group is gone; then the transport closes with the loop still open.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await asyncio.gather(*self._readers, return_exceptions=True)
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        return proc.returncode

    async def __aenter__(self) -> PeerProcess:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()


# -- the aiomoqt peers -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PeerObject:
    group: int
    subgroup: int | None
    object: int
    status: int
    payload: bytes
    recv_us: int


@dataclass(frozen=True, slots=True)
class PeerReport:
    """The aiomoqt subscriber's result line, decoded once here."""

    ok: bool
    stage: str | None
    error: str | None
    close_code: int | None
    reply: str | None
    objects: tuple[PeerObject, ...]
    publish_done_status: int | None
    subscribed_us: int | None
    draft: int | None  # the draft aiomoqt's handshake agreed (None: it never got that far)
    raw: Mapping[str, object] = field(repr=False)

    @classmethod
    def decode(cls, data: Mapping[str, object]) -> PeerReport:
        objects = data.get("objects", [])
        done = data.get("publish_done")
        if not isinstance(objects, list) or (done is not None and not isinstance(done, dict)):
            raise PeerError(f"malformed report {data!r:.300}")
        return cls(ok=data.get("ok") is True, stage=_opt(data, "stage", str), error=_opt(data, "error", str),
                   close_code=_opt(data, "close_code", int), reply=_opt(data, "reply", str),
                   objects=tuple(_peer_object(o) for o in objects),
                   publish_done_status=_opt(done, "status_code", int) if done else None,
                   subscribed_us=_opt(data, "subscribed_us", int), draft=_opt(data, "draft", int), raw=data)

    @property
    def layers(self) -> list[PeerObject]:
        return [o for o in self.objects if o.status == 0]

    def triples(self) -> list[tuple[int, int, bytes]]:
        return [(o.group, o.object, o.payload) for o in self.layers]


def _opt(data: Mapping[str, object], key: str, kind: type[T]) -> T | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise PeerError(f"report member {key!r} is not {kind.__name__}: {value!r:.100}")
    return value


def _peer_object(item: object) -> PeerObject:
    if not isinstance(item, dict):
        raise PeerError(f"malformed object {item!r:.200}")
    group, obj, status, recv = (_opt(item, k, int) for k in ("group", "object", "status", "recv_us"))
    payload = _opt(item, "payload", str)
    if group is None or obj is None or status is None or payload is None:
        raise PeerError(f"object without group/object/status/payload: {item!r:.200}")
    return PeerObject(group, _opt(item, "subgroup", int), obj, status, bytes.fromhex(payload), recv or 0)


Draft: TypeAlias = int | Literal["all"]
"""What an aiomoqt peer speaks: one draft alone (its ALPN only), or ``"all"``: aiomoqt's default list,
newest first (22, 20, 18, 16, 14), offered by a client / accepted by a server."""


class Aiomoqt:
    """Starts aiomoqt peers with the interop venv's interpreter; each speaks the ``draft`` it is given."""

    def __init__(self, python: Path, credentials: Credentials) -> None:
        self.python, self.credentials = python, credentials

    def _script(self, name: str, *args: str) -> list[str]:
        return [str(self.python), str(PEERS / name), *args]

    async def subscriber(self, uri: str, block: BlockSpec, mode: str, *, draft: Draft,
                         token: bytes | None = None, timeout: float = 10.0) -> PeerReport:
        """Run the aiomoqt subscriber to completion and return its report."""
        argv = self._script("aiomoqt_subscriber.py", uri, "--ca", str(self.credentials.ca), "--mode", mode,
                            "--timeout", str(timeout), "--draft", str(draft), *block.to_args())
        if token is not None:
            argv += ["--token", token.hex()]
        async with PeerProcess(f"aiomoqt subscriber ({mode})", argv) as peer:
            message = await peer.expect("result", 2 * timeout + 10)
            return PeerReport.decode(message.fields)

    def publisher(self, blocks: Sequence[BlockSpec], *, draft: Draft, live: Sequence[BlockSpec] = (),
                  listen: int | None = None, connect: str | None = None, interval: float = 0.05,
                  lifetime: float = 60.0) -> PeerProcess:
        """An aiomoqt publisher of ``blocks`` (stored: FETCH-able at once) and ``live`` (produced on the
        first SUBSCRIBE); all of the same sizes. Start it with ``async with``, then ``expect("ready")``
        (a client's carries the ``draft`` agreed; a server reports ``session`` with it per session)."""
        every = [*blocks, *live]
        if not every or len({(b.layers, b.k_size, b.v_size) for b in every}) != 1:
            raise ValueError("an aiomoqt publisher serves at least one block, all of one size")
        argv = self._script("aiomoqt_publisher.py", *every[0].to_args(), "--interval", str(interval),
                            "--lifetime", str(lifetime), "--draft", str(draft))
        for block in blocks:
            argv += ["--stored", block.track_arg()]
        for block in live:
            argv += ["--live", block.track_arg()]
        if listen is not None:
            argv += ["--listen", str(listen), "--cert", str(self.credentials.cert("aiomoqt")),
                     "--key", str(self.credentials.key("aiomoqt"))]
        elif connect is not None:
            argv += ["--connect", connect, "--ca", str(self.credentials.ca)]
        else:
            raise ValueError("give listen or connect")
        return PeerProcess("aiomoqt publisher", argv)

    def relay(self, port: int, *, draft: Draft) -> PeerProcess:
        """aiomoqt's ``moq-interop-relay`` on raw QUIC, accepting ``draft`` only (``"all"``: aiomoqt's default
        list), with the aiomoqt certificate. Ready once it logs "Listening on all interfaces" (see
        :data:`RELAY_READY`); it logs each session's draft (``d16 from 127.0.0.1:...``)."""
        spec = ",".join(map(str, AIOMOQT_DEFAULT_DRAFTS)) if draft == "all" else str(draft)
        script = self.python.parent / "moq-interop-relay"
        command = [str(script)] if script.is_file() else [str(self.python), "-m", "aiomoqt.tools.moq_interop_relay"]
        return PeerProcess("moq-interop-relay", [
            *command, "--bind", "127.0.0.1", "--port", str(port), "--quic", "--draft", spec,
            "--cert", str(self.credentials.cert("aiomoqt")), "--key", str(self.credentials.key("aiomoqt"))])


RELAY_READY: Final = "Listening on all interfaces"
