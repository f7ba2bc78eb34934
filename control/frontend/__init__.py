"""The front end role (decision D6): an OpenAI-shaped completions API in front of the PC and instances.

``kvsp serve frontend --config FILE`` serves the public API (``[frontend] listen``, plain HTTP for
loopback or TLS with a server certificate) and, like every role, health and Prometheus metrics on its
mutual-TLS listener.  See docs/frontend.md.
"""
