"""Guarded HTTP listeners: deadlines per connection, caps per client address, TLS refusals that say why.

`control.listener.core` decides (sans-I/O, handed ``now``); `control.listener.site` runs it under
aiohttp.  This ``__init__`` imports neither, so that importing the core loads no asyncio.
"""
