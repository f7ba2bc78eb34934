"""Inference instance role (spec sections 6.3, 6.5, 6.8, 6.9).

`control.instance.core` holds the sans-I/O state of one instance (its lifecycle, prefetch directives,
output gating of generating sessions, sequence shards); `kvsp.engine` is the interface to the model.
The HTTP adapter that answers the PC and drives the engine lives beside it.
"""
