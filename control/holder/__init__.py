"""The holder role (spec sections 6.1, 6.6, 6.7; decision D5): stores and serves KV blocks from tiers.

Layers, from the wire inwards: `app` (HTTP routes) -> `service.Holder` (asyncio adapter) ->
`store.BlockStore` and `leases.LeaseTable` (sans-I/O decisions) and `tiers` (host memory; `disk`: encrypted
local storage; `torch_tiers` adds torch host/device tiers, imported only when configured, and
`tierset.TierSet` places and moves layer ranges across the tiers present).  `publisher` keeps the Index
Service informed.

This package face re-exports nothing, so that importing a sans-I/O core (`store`, `leases`, ...)
loads no adapter; import the modules themselves.
"""
