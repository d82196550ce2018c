"""One turn at a time per session, and an inbox for the messages that arrive meanwhile.

- `gate`: `SessionGate`, a call's way through its session's lock under the
  busy policy, and which inbox a saver's sessions use (`inbox_for`);
- `inbox`: the rules every inbox keeps, and `ProcessInbox` (one process);
- `sql`: `SqlInbox`, the inbox in the checkpoint database, shared by every
  process that uses it, with leases on its rows;
- `databases`: the SQLite and Postgres specifics of `SqlInbox`.
"""

from graph.sessions.gate import (
    SessionBusyError,
    SessionGate,
    SessionReentryError,
    SessionWaitTimeout,
    inbox_for,
    queued,
)
from graph.sessions.inbox import ProcessInbox, SessionInbox

__all__ = [
    "ProcessInbox",
    "SessionBusyError",
    "SessionGate",
    "SessionInbox",
    "SessionReentryError",
    "SessionWaitTimeout",
    "inbox_for",
    "queued",
]
