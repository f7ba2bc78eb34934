"""MOQT over picoquic through aiopquic (issue 19; facts in docs/moqt-picoquic.md). Python >= 3.12 only.

So far the shim (`shim`): an aioquic-shaped connection a sans-I/O ``MoqtSession`` writes into, carried
onto aiopquic's ``QuicConnection``, and aiopquic's events turned into aioquic's event classes.
"""
