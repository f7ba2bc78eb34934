"""kvsp's side of the interop suite: a block publisher and a subscriber, on ``MoqtSession`` + ``moqt.quic``.

Deliberately small and independent of any higher-level pub/sub API: the point is to show what the
session and the adapter do on the wire against a third-party stack, so every request and answer is a
``MoqtSession`` call here and every peer action is a ``MoqtEvent`` there.

* :class:`BlockPublisher` serves blocks (decision D3: group 0, object l = layer l, one fetch stream or
  one end-of-group subgroup stream) to any number of connections: as a server it authenticates
  certificate-less clients by the AUTHORIZATION TOKEN in CLIENT_SETUP and authorizes SUBSCRIBE/FETCH
  by the token's scope IDs; as a client of a relay it announces its namespaces (PUBLISH_NAMESPACE).
* :class:`Subscriber` is one client connection that FETCHes or SUBSCRIBEs a block and collects it.
* :func:`verify_block` checks what arrived against the record's layer digests, as a receiver must.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from interop.content import BlockSpec
from kvsp.container import replica_digest
from moqt import (
    AuthToken,
    ControlMessageReceived,
    DataStreamEnded,
    FilterType,
    Location,
    MoqtEvent,
    MoqtSession,
    ObjectReceived,
    ObjectStatus,
    PublishDoneStatus,
    RequestError,
    SessionError,
    SessionEstablished,
    SessionTerminated,
    SetupParameters,
    SetupRequested,
)
from moqt.auth import AuthError
from moqt.errors import MoqtError
from moqt.messages import (
    ControlMessage,
    Fetch,
    FetchCancel,
    FetchError,
    FetchOk,
    PublishDone,
    PublishNamespaceError,
    PublishNamespaceOk,
    Subscribe,
    SubscribeError,
    SubscribeOk,
    Unsubscribe,
)
from moqt.quic import ConnectionClosedError, EndpointConfig, MoqtConnection, MoqtUri, QuicSettings, connect
from moqt.tls import PeerTrust

Conn: TypeAlias = MoqtConnection[MoqtEvent]
# aiomoqt's QUIC stack (aiopquic/picoquic) advertises max_udp_payload_size = 1440. aioquic does not
# honour that transport parameter by itself; moqt.quic.aioquic_hooks.HookedQuicConnection does, so the suite runs
# with our default loopback datagram size (16000) and proves the cap works.
INTEROP_SETTINGS = QuicSettings(handshake_timeout_s=5.0, auth_timeout_s=5.0)
SCOPE_FIELD = 2  # D3: namespace field 2 is the scope ID (hex16)


class InteropError(MoqtError):
    """The peer answered with an error, closed the session, or did not finish in time."""


# -- verification ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Received:
    """One object as it arrived (``at``: event-loop time of arrival)."""

    group: int
    subgroup: int | None
    object: int
    status: ObjectStatus
    payload: bytes
    at: float


def verify_block(spec: BlockSpec, objects: Sequence[tuple[int, int, bytes]]) -> bytes:
    """Check (group, object, payload) triples as a KVSP receiver does (D3) and return the replica digest.

    Every layer must arrive once, in ascending order, in group 0, and SHA-256 of its payload must equal
    the record's ``layer_digests[l]`` (here computed from ``spec``, independently of the publisher).
    """
    expected = [spec.layer_digest(layer) for layer in range(spec.layers)]
    got = [(group, obj) for group, obj, _ in objects]
    if got != [(0, layer) for layer in range(spec.layers)]:
        raise InteropError(f"objects {got} are not layers 0..{spec.layers - 1} of group 0 in order")
    for (_, layer, payload), want in zip(objects, expected, strict=True):
        actual = hashlib.sha256(payload).digest()
        if actual != want:
            raise InteropError(f"layer {layer}: digest {actual.hex()} != record {want.hex()}")
    return replica_digest(expected)


# -- publisher -------------------------------------------------------------------------------------
@dataclass(slots=True)
class PublisherStats:
    """What the publisher did, for assertions: request kind -> count, and the refusals it sent."""

    fetches: int = 0
    subscriptions: int = 0
    completed: int = 0
    refusals: list[tuple[str, RequestError]] = field(default_factory=list)
    setups_rejected: list[tuple[int, str]] = field(default_factory=list)


class BlockPublisher:
    """Serves ``blocks`` on every connection it is the event handler of (``on_event``).

    :param interval: seconds between layers on a subscription (a block "being produced", so layer l
        reaches the subscriber while layer l+1 is computed); FETCH sends at once (a stored block).
    :param path: server: the only PATH accepted.
    """

    def __init__(self, blocks: Sequence[BlockSpec], *, interval: float = 0.05, path: str | None = None) -> None:
        self.blocks = {(b.namespace, b.track): b for b in blocks}
        self.interval, self.path = interval, path
        self.stats = PublisherStats()
        self.sessions: dict[Conn, MoqtSession] = {}
        self.identities: list[str] = []  # peers admitted by token, in order
        self.setups: list[SetupParameters] = []  # every CLIENT_SETUP's parameters, as decoded
        self.announced: dict[tuple[bytes, ...], asyncio.Future[ControlMessage]] = {}
        self._announcing: dict[tuple[Conn, int], tuple[bytes, ...]] = {}  # PUBLISH_NAMESPACE request IDs
        self._tasks: dict[tuple[Conn, int], asyncio.Task[None]] = {}

    # -- wiring --------------------------------------------------------------------------------
    def session_factory(self, conn: Conn) -> MoqtSession:
        """Server connections answer setup only after the token check (``auto_accept=False``)."""
        if conn.is_client:
            session = MoqtSession(conn.quic, path=conn.uri.path if conn.uri else None)
        else:
            session = MoqtSession(conn.quic, path=self.path, auto_accept=False)
        self.sessions[conn] = session
        return session

    def on_event(self, conn: Conn, event: MoqtEvent) -> None:
        session = self.sessions[conn]
        if isinstance(event, SetupRequested):
            self._on_setup(conn, session, event)
        elif isinstance(event, SessionEstablished) and conn.is_client:
            loop = asyncio.get_running_loop()
            for namespace in dict.fromkeys(b.namespace for b in self.blocks.values()):
                self.announced[namespace] = loop.create_future()
                self._announcing[(conn, session.publish_namespace(namespace))] = namespace
        elif isinstance(event, ControlMessageReceived):
            self._on_control(conn, session, event.message)
        elif isinstance(event, SessionTerminated):
            for key in [k for k in self._tasks if k[0] is conn]:
                self._tasks.pop(key).cancel()
            for key in [k for k in self._announcing if k[0] is conn]:
                waiter = self.announced[self._announcing.pop(key)]
                if not waiter.done():
                    waiter.set_exception(InteropError(f"session ended: {event.reason_phrase}"))
                    waiter.exception()  # retrieved: nobody need be waiting

    def _on_setup(self, conn: Conn, session: MoqtSession, event: SetupRequested) -> None:
        """D3: a client without certificate must present a token in CLIENT_SETUP."""
        self.setups.append(event.message.parameters)
        try:
            if conn.authenticated_by != "certificate":
                if not event.authorization:
                    raise AuthError("no client certificate and no AUTHORIZATION TOKEN")
                claims = conn.authenticate_with_token(event.authorization[0].value)
                self.identities.append(claims.subject)
        except AuthError as exc:
            self.stats.setups_rejected.append((session.profile.session_errors.code(exc.error), str(exc)))
            session.reject_setup(exc.error, str(exc))
            return
        for follow_up in session.accept_setup():
            self.on_event(conn, follow_up)

    def _on_control(self, conn: Conn, session: MoqtSession, message: ControlMessage) -> None:
        match message:
            case Fetch():
                self._on_fetch(conn, session, message)
            case Subscribe():
                self._on_subscribe(conn, session, message)
            case FetchCancel(request_id=rid) | Unsubscribe(request_id=rid):
                task = self._tasks.pop((conn, rid), None)
                if task is not None:
                    task.cancel()
            case PublishNamespaceOk(request_id=rid) | PublishNamespaceError(request_id=rid):
                namespace = self._announcing.pop((conn, rid), None)
                if namespace is not None and not self.announced[namespace].done():
                    self.announced[namespace].set_result(message)
            case _:
                pass

    def _authorized(self, conn: Conn, block: BlockSpec) -> bool:
        """D3: SUBSCRIBE/FETCH only from identities authorized for the namespace's scope ID."""
        if conn.is_client or conn.authenticated_by == "certificate":
            return True  # the relay we dialled, or a peer our CA vouches for
        claims = conn.token_claims
        try:
            scope = bytes.fromhex(block.namespace[SCOPE_FIELD].decode())
        except (IndexError, ValueError):
            return False
        return claims is not None and claims.allows_scope(scope)

    def _lookup(self, conn: Conn, namespace: tuple[bytes, ...], track: bytes
                ) -> tuple[BlockSpec | None, RequestError | None]:
        block = self.blocks.get((tuple(namespace), track))
        if block is None:
            return None, RequestError.TRACK_DOES_NOT_EXIST
        if not self._authorized(conn, block):
            return None, RequestError.UNAUTHORIZED
        return block, None

    def _on_fetch(self, conn: Conn, session: MoqtSession, message: Fetch) -> None:
        rid, wanted = message.request_id, message.standalone
        if wanted is None:
            self.stats.refusals.append(("fetch", RequestError.NOT_SUPPORTED))
            session.fetch_error(rid, RequestError.NOT_SUPPORTED, "only standalone FETCH of stored blocks")
            return
        block, code = self._lookup(conn, wanted.track_namespace, wanted.track_name)
        # [start, end): End Location is the last object plus 1; object 0 means all of the end group.
        first = wanted.start.object if wanted.start.group == 0 else None
        if wanted.end.group > 0 or wanted.end.object == 0:
            last = block.layers - 1 if block else -1
        else:
            last = min(wanted.end.object - 1, block.layers - 1) if block else -1
        if block is None or first is None or first > last:
            code = code or RequestError.INVALID_RANGE
            self.stats.refusals.append(("fetch", code))
            session.fetch_error(rid, code, "no such block" if block is None else "no layers in that range")
            return
        self.stats.fetches += 1
        session.fetch_ok(rid, Location(0, last + 1), end_of_track=last == block.layers - 1)
        self._spawn(conn, rid, self._send_fetch(conn, session, rid, block, first=first, last=last))

    def _on_subscribe(self, conn: Conn, session: MoqtSession, message: Subscribe) -> None:
        rid = message.request_id
        block, code = self._lookup(conn, message.track_namespace, message.track_name)
        if block is None:
            code = code or RequestError.INTERNAL_ERROR  # _lookup names why; never unnamed
            self.stats.refusals.append(("subscribe", code))
            reason = "no such block" if code is RequestError.TRACK_DOES_NOT_EXIST else "scope not in token"
            session.subscribe_error(rid, code, reason)
            return
        self.stats.subscriptions += 1
        session.subscribe_ok(rid)  # no Largest Location: the block is being produced from layer 0
        first = 0
        if message.filter_type in (FilterType.ABSOLUTE_START, FilterType.ABSOLUTE_RANGE) and message.start_location:
            first = message.start_location.object if message.start_location.group == 0 else block.layers
        self._spawn(conn, rid, self._send_live(conn, session, rid, block, first))

    def _spawn(self, conn: Conn, rid: int, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks[(conn, rid)] = task
        task.add_done_callback(lambda _: self._tasks.pop((conn, rid), None))

    async def _send_fetch(self, conn: Conn, session: MoqtSession, rid: int, block: BlockSpec, *,
                          first: int, last: int) -> None:
        stream = session.open_fetch_stream(rid)
        try:
            for layer in range(first, last + 1):
                session.send_fetch_object(stream, 0, 0, layer, block.payload(layer), end_of_stream=layer == last)
                await conn.drain(stream)
            self.stats.completed += 1
        except asyncio.CancelledError:
            with contextlib.suppress(MoqtError):
                session.reset_stream(stream)
            raise
        except (MoqtError, ConnectionClosedError):
            return  # the peer went away or stopped the stream: nothing left to send to

    async def _send_live(self, conn: Conn, session: MoqtSession, rid: int, block: BlockSpec, first: int) -> None:
        """One subgroup stream whose FIN ends group 0 (D3), then PUBLISH_DONE TRACK_ENDED."""
        stream = session.open_subgroup(rid, 0, 0, end_of_group=True)
        try:
            for layer in range(first, block.layers):
                if layer > first:
                    await asyncio.sleep(self.interval)  # "computing" the next layer
                session.send_object(stream, layer, block.payload(layer), end_of_stream=layer == block.layers - 1)
                await conn.drain(stream)
            if first >= block.layers:
                session.finish_stream(stream)
            session.publish_done(rid, PublishDoneStatus.TRACK_ENDED, "block complete")
            self.stats.completed += 1
        except asyncio.CancelledError:
            with contextlib.suppress(MoqtError):
                session.reset_stream(stream)
            raise
        except (MoqtError, ConnectionClosedError):
            return

    async def wait_announced(self, timeout: float) -> None:
        """Client of a relay: wait for PUBLISH_NAMESPACE_OK for every namespace; raise on an error."""
        async with asyncio.timeout(timeout):
            while not self.announced:
                await asyncio.sleep(0.01)
            for waiter in list(self.announced.values()):
                answer = await waiter
                if isinstance(answer, PublishNamespaceError):
                    raise InteropError(f"PUBLISH_NAMESPACE refused: {answer.error_code} {answer.reason}")

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- subscriber ------------------------------------------------------------------------------------
@dataclass(slots=True)
class TrackResult:
    """What one FETCH or SUBSCRIBE produced."""

    request_id: int
    reply: ControlMessage | None = None
    objects: list[Received] = field(default_factory=list)
    stream_ended: bool = False
    end_of_group: bool = False
    publish_done: PublishDone | None = None
    requested_at: float = 0.0

    @property
    def layers(self) -> list[Received]:
        return [o for o in self.objects if o.status == ObjectStatus.NORMAL]

    def triples(self) -> list[tuple[int, int, bytes]]:
        return [(o.group, o.object, o.payload) for o in self.layers]


def client_config(ca: Path, settings: QuicSettings | None = None, *,
                  drafts: tuple[int, ...] | None = None) -> EndpointConfig:
    """A certificate-less client that verifies the server against ``ca`` (D3: tokens authenticate us),
    offering the ALPNs of ``drafts`` (None: the settings' own, by default every draft we speak)."""
    settings = settings or INTEROP_SETTINGS
    if drafts is not None:
        settings = dataclasses.replace(settings, drafts=drafts)
    return EndpointConfig(PeerTrust.load(ca), None, settings)


class Subscriber:
    """One client session; ``fetch``/``subscribe`` run one request at a time off its event queue."""

    def __init__(self, conn: Conn, session: MoqtSession) -> None:
        self.conn, self.session = conn, session
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def connect(cls, uri: str, ca: Path, *, token: bytes | None = None, timeout: float = 10.0,
                      drafts: tuple[int, ...] | None = None) -> Subscriber:
        """Connect offering ``drafts`` (None: every draft we speak, newest first) and wait for the
        server's setup."""
        params = SetupParameters(authorization_tokens=(AuthToken.use_value(0, token),) if token else ())
        holder: list[MoqtSession] = []
        path = MoqtUri.parse(uri).path

        def factory(conn: Conn) -> MoqtSession:
            holder.append(MoqtSession(conn.quic, path=path, setup_parameters=params))
            return holder[0]

        conn: Conn = await connect(uri, client_config(ca, drafts=drafts), factory)
        try:
            async with asyncio.timeout(timeout):
                event = await conn.next_event()
            if not isinstance(event, SessionEstablished):
                raise InteropError(f"expected SERVER_SETUP, got {event!r}")
        except BaseException:
            await cls(conn, holder[0]).close()
            raise
        return cls(conn, holder[0])

    async def _next(self, deadline: float) -> MoqtEvent:
        try:
            async with asyncio.timeout_at(deadline):
                return await self.conn.next_event()
        except ConnectionClosedError as exc:
            raise InteropError(f"session closed: {exc}") from exc

    def _take(self, result: TrackResult, event: MoqtEvent) -> None:
        """Fold one event of ``result``'s request into it; raise on an error answer or a close."""
        if isinstance(event, SessionTerminated):
            raise InteropError(f"session terminated (0x{event.error_code:x}): {event.reason_phrase}")
        if isinstance(event, ObjectReceived) and event.request_id == result.request_id:
            result.objects.append(Received(event.group_id, event.subgroup_id, event.object_id, event.status,
                                           bytes(event.payload), self._loop.time()))
            result.end_of_group |= event.end_of_group or event.status == ObjectStatus.END_OF_GROUP
        elif isinstance(event, DataStreamEnded) and event.request_id == result.request_id:
            result.stream_ended = True
            result.end_of_group |= event.end_of_group
        elif isinstance(event, ControlMessageReceived):
            message = event.message
            if isinstance(message, FetchError | SubscribeError) and message.request_id == result.request_id:
                raise InteropError(f"{message.KIND.value} {message.error_code}: {message.reason}")
            if isinstance(message, FetchOk | SubscribeOk) and message.request_id == result.request_id:
                result.reply = message
            elif isinstance(message, PublishDone) and message.request_id == result.request_id:
                result.publish_done = message

    async def fetch(self, spec: BlockSpec, *, timeout: float = 10.0) -> TrackResult:
        """Standalone FETCH (0,0)..(0,layers): the whole stored block on one fetch stream."""
        deadline = self._loop.time() + timeout
        rid = self.session.fetch(spec.namespace, spec.track, Location(0, 0), Location(0, spec.layers))
        result = TrackResult(rid, requested_at=self._loop.time())
        while result.reply is None or not result.stream_ended:
            self._take(result, await self._next(deadline))
        return result

    async def subscribe(self, spec: BlockSpec, *, timeout: float = 10.0, publish_done_wait: float = 2.0,
                        filter_type: FilterType = FilterType.LARGEST_OBJECT) -> TrackResult:
        """SUBSCRIBE and collect the block as it is produced, until every layer arrived and its subgroup
        stream ended (FIN), then PUBLISH_DONE (waited for ``publish_done_wait`` seconds at most)."""
        deadline = self._loop.time() + timeout
        rid = self.session.subscribe(spec.namespace, spec.track, filter_type=filter_type)
        result = TrackResult(rid, requested_at=self._loop.time())
        while result.reply is None or len(result.layers) < spec.layers or not result.stream_ended:
            self._take(result, await self._next(deadline))
        done_deadline = min(deadline, self._loop.time() + publish_done_wait)
        with contextlib.suppress(TimeoutError):
            while result.publish_done is None:
                self._take(result, await self._next(done_deadline))
        return result

    async def close(self, timeout: float = 5.0) -> None:
        self.conn.close(self.session.profile.session_errors.code(SessionError.NO_ERROR), "done")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.conn.wait_closed()
