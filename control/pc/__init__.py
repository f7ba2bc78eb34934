"""Placement Controller role (spec sections 6.3, 6.4, 6.8, 6.9).

`control.pc.core` holds the sans-I/O state machines (instance registry and lifecycle, sessions and
checkpoints, resharding, placement); they take ``now`` and return typed actions.  The HTTP adapter
that receives status and checkpoint PUTs and carries out the actions lives beside it.
"""
