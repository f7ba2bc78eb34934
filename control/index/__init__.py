"""The Index Service role (spec sections 6.1-6.3): replica index, instance statuses, HTTPS adapter.

`ReplicaIndex` and `StatusBoard` are sans-I/O (``now`` passed in); ``control.index.app.setup`` puts
them behind the mutual-TLS HTTP routes.  A PC in the same process shares the board via `STATUS_BOARD`.

This package face re-exports nothing, so that importing a sans-I/O core (`store`, `leases`, ...)
loads no adapter; import the modules themselves.
"""
