"""Two MOQT peers in memory: real aioquic connections, real TLS, no sockets, a fake clock.

Why it ships in the package: the relay and the KVSP MOQT client test their logic against a real
``MoqtSession`` pair without the network, the way aioquic's own tests pass packets between two
in-memory connections. The certificate (ECDSA P-256) is made on the fly; nothing touches the disk.
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import HandshakeCompleted, QuicEvent, StreamDataReceived
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from moqt.events import ControlMessageReceived, MoqtEvent, SessionTerminated
from moqt.messages import ClientSetup, ControlMessage, ControlStreamParser, ServerSetup
from moqt.params import SetupParameters
from moqt.profiles import DRAFT_14, Profile
from moqt.session import MoqtSession

CLIENT_ADDR: Final = ("10.0.0.1", 4433)
SERVER_ADDR: Final = ("10.0.0.2", 443)


def make_test_certificate(host: str = "localhost") -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed ECDSA P-256 certificate for ``host``, valid for a day around now."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def quic_configurations(host: str = "localhost", *, alpn: str = DRAFT_14.alpn,
                        max_datagram_frame_size: int = 65536) -> tuple[QuicConfiguration, QuicConfiguration]:
    """(client, server) configurations: ALPN ``moq-00``, QUIC DATAGRAM on, client trusts the test cert."""
    cert, key = make_test_certificate(host)
    server = QuicConfiguration(is_client=False, alpn_protocols=[alpn], max_datagram_frame_size=max_datagram_frame_size)
    server.certificate = cert
    server.private_key = key
    client = QuicConfiguration(is_client=True, alpn_protocols=[alpn], server_name=host,
                               max_datagram_frame_size=max_datagram_frame_size,
                               cadata=cert.public_bytes(serialization.Encoding.PEM))
    return client, server


@dataclass
class Peer:
    """One side: its QUIC connection, its session (after the handshake) and the events it produced."""

    quic: QuicConnection
    address: tuple[str, int]
    session: MoqtSession | None = None
    events: list[MoqtEvent] = field(default_factory=list)

    @property
    def moqt(self) -> MoqtSession:
        if self.session is None:
            raise RuntimeError("the QUIC handshake has not completed")
        return self.session

    def take(self) -> list[MoqtEvent]:
        """The events collected so far, clearing them."""
        events, self.events = self.events, []
        return events


class MoqtPair:
    """A client and a server connected back to back; ``pump`` runs them until nothing moves.

    ``client_options``/``server_options`` are passed to ``MoqtSession``; ``profile`` puts both peers at
    that draft (its ALPN on both QUIC configurations, the profile in both sessions' options); ``now`` is
    the fake clock, advanced only to fire QUIC timers (ACK delay, loss detection, draining).
    """

    def __init__(self, *, client_options: dict[str, Any] | None = None,
                 server_options: dict[str, Any] | None = None, host: str = "localhost",
                 quic_setup: Callable[[QuicConfiguration, QuicConfiguration], None] | None = None,
                 profile: Profile | None = None) -> None:
        client_cfg, server_cfg = quic_configurations(host)
        if profile is not None:
            client_cfg.alpn_protocols = server_cfg.alpn_protocols = [profile.alpn]
            client_options = {"profile": profile, **(client_options or {})}
            server_options = {"profile": profile, **(server_options or {})}
        if quic_setup is not None:
            quic_setup(client_cfg, server_cfg)
        self.now = 0.0
        self.client = Peer(QuicConnection(configuration=client_cfg), CLIENT_ADDR)
        self.server = Peer(QuicConnection(configuration=server_cfg,
                                          original_destination_connection_id=self.client.quic.original_destination_connection_id),
                           SERVER_ADDR)
        self._options = {id(self.client): client_options or {}, id(self.server): server_options or {}}
        self.client.quic.connect(SERVER_ADDR, now=self.now)
        self.pump()

    def _drain_events(self, peer: Peer) -> None:
        while (event := peer.quic.next_event()) is not None:
            self._dispatch(peer, event)

    def _dispatch(self, peer: Peer, event: QuicEvent) -> None:
        if isinstance(event, HandshakeCompleted) and peer.session is None:
            peer.session = MoqtSession(peer.quic, **self._options[id(peer)])
        elif peer.session is not None:
            peer.events.extend(peer.session.handle_event(event))

    def _exchange(self) -> bool:
        moved = False
        for src, dst in ((self.client, self.server), (self.server, self.client)):
            for data, _ in src.quic.datagrams_to_send(now=self.now):
                moved = True
                dst.quic.receive_datagram(data, src.address, now=self.now)
        for peer in (self.client, self.server):
            self._drain_events(peer)
        return moved

    def _fire_timers(self, horizon: float) -> bool:
        timers = [t for t in (self.client.quic.get_timer(), self.server.quic.get_timer()) if t is not None]
        session_timers = [t for p in (self.client, self.server) if p.session is not None
                          for t in (p.session.get_timer(),) if t is not None]
        due = min(timers + session_timers, default=None)
        if due is None or due > self.now + horizon:
            return False
        self.now = max(self.now, due)
        for peer in (self.client, self.server):
            timer = peer.quic.get_timer()
            if timer is not None and timer <= self.now:
                peer.quic.handle_timer(now=self.now)
            if peer.session is not None and (t := peer.session.get_timer()) is not None and t <= self.now:
                peer.events.extend(peer.session.handle_timer(self.now))
            self._drain_events(peer)
        return True

    def pump(self, *, horizon: float = 0.2, max_rounds: int = 100_000) -> None:
        """Move datagrams both ways until quiet, firing timers due within ``horizon`` seconds."""
        for _ in range(max_rounds):
            if not self._exchange() and not self._fire_timers(horizon):
                return
        raise RuntimeError("the peers did not settle")

    def advance(self, seconds: float) -> None:
        """Move the fake clock forward (firing everything due), then pump."""
        end = self.now + seconds
        while self._fire_timers(end - self.now):
            self._exchange()
        self.now = end
        self.pump()


class RecordingQuic:
    """A stand-in for ``QuicConnection`` that records what a session writes (httpx-style mock).

    Tests feed the session hand-made QUIC events and read back the octets, resets and the close,
    which makes byte-level and fuzz tests fast and exact.
    """

    def __init__(self, *, is_client: bool) -> None:
        self.configuration = QuicConfiguration(is_client=is_client)
        self.stream_data: defaultdict[int, bytearray] = defaultdict(bytearray)
        self.finished: set[int] = set()
        self.datagrams: list[bytes] = []
        self.resets: dict[int, int] = {}
        self.stops: dict[int, int] = {}
        self.close_args: tuple[int, str] | None = None
        self._next_bidi = 0 if is_client else 1
        self._next_uni = 2 if is_client else 3

    def get_next_available_stream_id(self, is_unidirectional: bool = False) -> int:
        if is_unidirectional:
            stream_id, self._next_uni = self._next_uni, self._next_uni + 4
        else:
            stream_id, self._next_bidi = self._next_bidi, self._next_bidi + 4
        return stream_id

    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        if stream_id in self.finished or stream_id in self.resets:
            raise RuntimeError(f"stream {stream_id} is finished")
        self.stream_data[stream_id] += data
        if end_stream:
            self.finished.add(stream_id)

    def send_datagram_frame(self, data: bytes) -> None:
        self.datagrams.append(bytes(data))

    def reset_stream(self, stream_id: int, error_code: int) -> None:
        self.resets.setdefault(stream_id, error_code)

    def stop_stream(self, stream_id: int, error_code: int) -> None:
        self.stops.setdefault(stream_id, error_code)

    def close(self, error_code: int = 0, frame_type: int | None = None, reason_phrase: str = "") -> None:
        if self.close_args is None:
            self.close_args = (error_code, reason_phrase)

    def control_messages(self, stream_id: int = 0) -> list[ControlMessage]:
        """Decode everything the session wrote on its control stream."""
        return ControlStreamParser().feed(bytes(self.stream_data[stream_id]))


def recording_session(*, is_client: bool, **options: Any) -> tuple[MoqtSession, RecordingQuic]:
    """A session over a ``RecordingQuic``."""
    quic = RecordingQuic(is_client=is_client)
    return MoqtSession(cast(QuicConnection, quic), **options), quic


def client_setup_bytes(parameters: SetupParameters | None = None, versions: tuple[int, ...] | None = None,
                       profile: Profile = DRAFT_14) -> bytes:
    """A CLIENT_SETUP granting the server 100 requests, for feeding a server session by hand (``versions``
    default: the profile's, where its setup carries versions)."""
    if versions is None:
        versions = (profile.version,) if profile.layout.setup_versions else ()
    return ClientSetup(versions, parameters or SetupParameters(max_request_id=199)).encode(profile)


def server_setup_bytes(parameters: SetupParameters | None = None, profile: Profile = DRAFT_14) -> bytes:
    """A SERVER_SETUP granting the client 100 requests, for feeding a client session by hand."""
    return ServerSetup(profile.version, parameters or SetupParameters(max_request_id=200)).encode(profile)


def feed_control(session: MoqtSession, octets: bytes) -> list[MoqtEvent]:
    """Hand the session octets as if they arrived on its control stream (stream 0)."""
    return session.handle_event(StreamDataReceived(octets, False, 0))


def established_session(*, is_client: bool, **options: Any) -> tuple[MoqtSession, RecordingQuic]:
    """A session over a ``RecordingQuic`` whose setup is done (the peer granted 100 requests); at the
    ``profile`` option's draft, one whose control stream is bidirectional (draft-14, draft-16)."""
    session, quic = recording_session(is_client=is_client, **options)
    profile = session.profile
    if profile.data_framing.control_stream_type is not None:
        raise ValueError(f"draft-{profile.draft} sets up on unidirectional streams (test_moqt_draft18_session.py)")
    feed_control(session, server_setup_bytes(profile=profile) if is_client else client_setup_bytes(profile=profile))
    if not session.is_established:
        raise RuntimeError("setup failed")
    return session, quic


E = TypeVar("E", bound=MoqtEvent)


def only(events: list[MoqtEvent], kind: type[E]) -> list[E]:
    """The events of one kind, in order."""
    return [e for e in events if isinstance(e, kind)]


def received_messages(events: list[MoqtEvent]) -> list[ControlMessage]:
    """The control messages the session let through to the application."""
    return [e.message for e in events if isinstance(e, ControlMessageReceived)]


def terminated(events: list[MoqtEvent]) -> SessionTerminated:
    """The one ``SessionTerminated`` among ``events`` (raises unless there is exactly one)."""
    ends = only(events, SessionTerminated)
    if len(ends) != 1:
        raise AssertionError(f"expected one SessionTerminated, got {events!r:.300}")
    return ends[0]


def established_server(**options: Any) -> tuple[MoqtSession, RecordingQuic]:
    """A server session over a ``RecordingQuic``, past setup."""
    return established_session(is_client=False, **options)


def established_client(**options: Any) -> tuple[MoqtSession, RecordingQuic]:
    """A client session over a ``RecordingQuic``, past setup."""
    return established_session(is_client=True, **options)
