"""Interop suite against a third-party MOQT stack (aiomoqt 0.13.3 from PyPI); see interop/README.md.

``content`` (standard library only) is shared with the aiomoqt peers in ``peers/``, which run in their
own Python 3.12 venv; ``endpoints`` and ``harness`` are kvsp's side, used by tests/test_interop.py.
"""
