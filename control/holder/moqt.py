"""The holder's MOQT publisher (decision D3): its stored blocks as tracks, read by FETCH.

With ``[holder] moqt_listen`` and ``moqt_uri`` set, the holder also listens for MOQT over QUIC and
serves every block it stores as the track of namespace ``(kvsp, compat, scope, holder-id, block_key)``
named by the codec: object ``l`` of group 0 is layer ``l``, its payload a view of the stored K||V
octets (host memory: no copy; local storage: one decrypting read per tier segment, as for HTTPS).

Identity: the certificate's URI SAN stays the holder's ``https`` base URI, which is its identity on
QUIC too; the namespace's holder-id field is ``role_id`` of that base URI (the producer, as D3 and
spec section 4.4 make it the holder for authorization). Beside each ``https`` record the holder
publishes a second Replica Record with ``holder`` = the ``moqt://`` URI (its own, or with
``moqt_relay`` the relay's: `HolderMoqt.uri`) and ``moqt_namespace``; the IS accepts it because the
namespace names the publishing holder, and keeps it apart from other producers' records at the same
relay URI. Both are refreshed and withdrawn together (``Publisher.add_variant``), the MOQT one at the
URI it names, with this holder as the producer.

Authorization: peers authenticate with a client certificate of the deployment CA, or with an
AUTHORIZATION_TOKEN signed by a key in ``moqt_token_keys``; FETCH needs ``policy.may_read`` on the
namespace's scope (a token must also name the scope or a namespace prefix). A namespace of another
producer is answered TRACK_DOES_NOT_EXIST: this holder publishes only its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from control.holder.service import Holder
from control.holder.settings import MoqtSettings
from control.holder.store import BlockId, Entry
from control.holder.tiers import StorageCorruptError
from kvsp.container import LayerRange
from kvsp.identifiers import TrackNamespace, role_id
from kvsp.moqt_binding import BLOCK_GROUP, kvsp_authorizer, kvsp_token_rule, layer_object, layer_range_of, track_name
from kvsp.records import ReplicaRecord
from kvsp.service.config import RoleConfig
from kvsp.service.metrics import MoqtSessionsCollector, metrics_of
from kvsp.service.tokens import load_token_key
from moqt.api import MoqtObject, Publisher, PublisherSettings, StoredTrack, UpstreamLink
from moqt.errors import MoqtError
from moqt.quic import EndpointConfig, MoqtUri, QuicSettings
from moqt.wire import Location, Namespace

log = logging.getLogger("kvsp.holder.moqt")


class BlockTrack:
    """One stored block as a MOQT track (a ``StoredTrack``): complete, group 0, one object per layer."""

    def __init__(self, holder: Holder, entry: Entry) -> None:
        self.holder = holder
        self.entry = entry

    @property
    def largest(self) -> Location:
        return Location(BLOCK_GROUP, self.entry.meta.layers.last)

    @property
    def complete(self) -> bool:
        return True

    async def read(self, start: Location, end: Location) -> AsyncIterator[MoqtObject]:
        meta = self.entry.meta
        layers = layer_range_of(start, end, meta.layers.last)
        if layers is None:
            return
        for segment in self.entry.segments(layers):
            data = await self._read(segment.layers)
            base = meta.offset(segment.layers.first)
            for layer in segment.layers:
                lo, hi = meta.offset(layer) - base, meta.offset(layer + 1) - base
                yield layer_object(layer, data[lo:hi], meta.header.lengths[layer][0], meta.codec)
        metrics = self.holder.metrics
        metrics.blocks_served.labels("moqt-full" if layers == meta.layers else "moqt-range").inc()
        metrics.bytes_served.labels("moqt").inc(meta.octets(layers))

    async def _read(self, layers: LayerRange) -> memoryview:
        """K||V of ``layers`` the way HTTPS GET reads them: a view of host memory, else decrypted from
        local storage; a block that fails authentication at rest is withdrawn and dropped (as GET does)."""
        holder, meta = self.holder, self.entry.meta
        try:
            return await holder._read(meta, layers)  # the tier-read path GET uses (host, then disk)
        except StorageCorruptError as exc:
            log.error("%s; withdrawing and dropping it", exc)
            await holder.lose(meta.block)
            raise


class HolderTrackSource:
    """The holder's blocks as a ``TrackSource``: only namespaces naming this holder as producer."""

    def __init__(self, holder: Holder, holder_id: str) -> None:
        self.holder = holder
        self.holder_id = holder_id

    async def lookup(self, namespace: Namespace, name: bytes) -> StoredTrack | None:
        try:
            fields = TrackNamespace.from_fields(namespace)
        except ValueError:
            return None
        if fields.holder_id != self.holder_id:
            return None
        holder = self.holder
        entry = holder.store.get(BlockId(fields.compat_id, fields.scope_id, fields.block_key), holder.clock())
        if entry is None or name != track_name(entry.meta.codec):
            return None
        return BlockTrack(holder, entry)


class HolderMoqt:
    """The MOQT side of one holder: its publisher, its records, its lifecycle.

    With ``moqt_relay`` the holder also keeps a session to its rack relay (reconnecting with backoff),
    announces there the namespace prefix ``(kvsp, compat, scope, holder-id)`` of every compat and scope
    it may store, and its MOQT records name the relay's URI: readers reach the block through the relay
    chain (D4), which fetches it from this holder once and serves it from its cache afterwards. FETCH
    and SUBSCRIBE arriving from the connected relay are allowed (it authorized its subscribers itself).
    The holder is that session's QUIC client, so it PINGs it when idle (``QuicSettings.keepalive``):
    the session outlives any idle period, and a vanished relay is noticed within seconds.
    """

    def __init__(self, holder: Holder, config: RoleConfig, settings: MoqtSettings) -> None:
        self.holder = holder
        self.config = config
        self.settings = settings
        self.uri = settings.relay or settings.uri
        self.holder_id = role_id(config.server.base_uri)
        self.relay_link: UpstreamLink | None = None
        may_read = config.policy.may_read
        readers = kvsp_authorizer(lambda who, scope: self._is_relay(who) or may_read(who, scope))
        self.publisher = Publisher(HolderTrackSource(holder, self.holder_id), authorize=readers,
                                   token_rule=kvsp_token_rule,
                                   settings=PublisherSettings(path=MoqtUri.parse(settings.uri).path))
        self._announced: set[tuple[bytes, bytes]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def _is_relay(self, identity: str) -> bool:
        link = self.relay_link
        return link is not None and link.endpoint is not None and link.endpoint.link.peer_identity == identity

    def record_for(self, record: ReplicaRecord) -> ReplicaRecord:
        """The MOQT record of a replica: the same digests and residency, served at ``moqt_uri`` (or the relay's)."""
        namespace = TrackNamespace(record.compat_id, record.scope_id, self.holder_id, record.block_key)
        self.announce(record.compat_id, record.scope_id)
        return dataclasses.replace(record, holder=self.uri, moqt_namespace=namespace)

    def prefix(self, compat_id: bytes, scope_id: bytes) -> Namespace:
        return (b"kvsp", compat_id.hex().encode(), scope_id.hex().encode(), self.holder_id.encode())

    def announce(self, compat_id: bytes, scope_id: bytes) -> None:
        """PUBLISH_NAMESPACE of this holder's prefix for a compat and scope, at the relay (once)."""
        if self.settings.relay is None or (compat_id, scope_id) in self._announced:
            return
        self._announced.add((compat_id, scope_id))
        task = asyncio.get_running_loop().create_task(self._announce(self.prefix(compat_id, scope_id)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _announce(self, namespace: Namespace) -> None:
        try:
            await self.publisher.publish_namespace(namespace)
        except (MoqtError, OSError, TimeoutError) as exc:  # announced again on the next relay session
            log.warning("announcing %r at the relay failed: %s", namespace, exc)

    def endpoint_config(self) -> EndpointConfig:
        tls = self.config.tls
        if tls is None:
            raise ValueError("the holder's MOQT listener needs [tls] (mutual authentication, D3)")
        keys = tuple(load_token_key(path) for path in self.settings.token_keys)
        quic = QuicSettings(max_datagram_size=self.settings.max_datagram_size,
                            max_connections_per_client=self.settings.max_connections_per_client,
                            drafts=self.settings.drafts, quic=self.config.moqt.quic)
        return EndpointConfig.from_files(tls.cert, tls.key, tls.ca, quic, token_keys=keys)

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        config = self.endpoint_config()
        port = await self.publisher.listen(self.settings.host, self.settings.port, config)
        log.info("serving blocks over MOQT on %s:%d as %s (drafts %s, %s)", self.settings.host, port, self.uri,
                 ", ".join(str(p.draft) for p in config.settings.profiles), config.settings.quic)
        metrics_of(app).registry.register(MoqtSessionsCollector("kvsp_holder", lambda: self.publisher.server))
        if self.settings.relay is not None:
            self.relay_link = UpstreamLink(self.publisher, self.settings.relay, config,
                                           token=self.config.moqt.token_source("the holder's relay link"))
            for compat_id in self.holder.settings.descriptors:
                for scope_id in self.config.policy.scopes:
                    if self.config.policy.may_store(self.config.server.base_uri, scope_id):
                        self.announce(compat_id, scope_id)
            self.relay_link.start()
        try:
            yield
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self.relay_link is not None:
                await self.relay_link.close()
            await self.publisher.close()


HOLDER_MOQT: web.AppKey[HolderMoqt] = web.AppKey("kvsp.holder.moqt", HolderMoqt)


def setup(app: web.Application, config: RoleConfig, holder: Holder) -> None:
    """With ``moqt_listen`` configured: serve blocks over MOQT and publish their MOQT records."""
    settings = holder.settings.moqt
    if settings is None:
        return
    moqt = HolderMoqt(holder, config, settings)
    app[HOLDER_MOQT] = moqt
    holder.publisher.add_variant(moqt.uri, moqt.record_for)  # the URI record_for puts in the records
    app.cleanup_ctx.append(moqt.lifecycle)
