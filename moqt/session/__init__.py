"""The sans-I/O MOQT session (like aioquic's ``H3Connection``), in modules named by job.

``connection`` holds ``MoqtSession`` (setup, lifecycle, the event loop-free entry points); ``state``
the tables every part shares; ``inbound`` the peer's control messages; ``outbound`` ours;
``request_state`` the (kind, state, message) table every request moves by; ``request_ids`` Request
ID allocation and MAX_REQUEST_ID; ``data_streams`` objects in; ``sending`` objects out; ``tokens``
the AUTHORIZATION TOKEN alias cache; ``shapes`` the per-draft strategy for what changed shape between
drafts (draft-16's REQUEST_OK / REQUEST_ERROR answers and SUBSCRIBE_NAMESPACE streams; draft-18's
control streams opened by SETUP and a stream per request, cancelled by resets).
"""

from moqt.session.connection import MoqtSession, Role
from moqt.session.state import SessionLimits

__all__ = ["MoqtSession", "Role", "SessionLimits"]
