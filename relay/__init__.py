"""The MOQT relay of kvsp (decision D4; docs/relay.md): ``kvsp serve relay --config FILE``.

`relay.core` holds the sans-I/O rules (routing, cache, send queues, stats), `relay.server.Relay` the
asyncio relay over ``moqt.api`` (whose `moqt.api.UpstreamLink` keeps the sessions to upstream relays up).
"""
