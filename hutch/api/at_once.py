"""How many requests one organization has under way at once on this server: bounded, so that
what one tenant holds (long-polls, stream reads, terminals, downloads, relayed port requests)
cannot take the server's file descriptors, and with them every other tenant's requests.

Each request under way holds at least its connection's socket for as long as it runs, and a
long-poll may run for as long as its caller asks. Before this bound a member key holding 1,100
status long-polls on a server with the usual open-file limit (1024) left it unable to accept
any connection: another organization's create hung until the long-polls ended, and the server
logged an error per accept it retried. Now an organization's request past its share is
answered 429 ``RATE_LIMITED`` naming the bound, and its connection is closed (an answered
connection kept alive would hold the socket all the same).

Counted where the organization is known: requests with a key or a session (the auth
middleware), and the public reads the organization's own capabilities allow (a stream or audit read, a
request to a sandbox's port: the sandbox's organization). Connections that have not yet sent a
request belong to no one: a deadline for each request head and a bound on the connections
waiting for one keep those (edge/listener.py).
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator

from hutch.core.errors import RateLimited

# An organization's share: a quarter of the open files the server may have, at most this
# many. 1,000 requests at once is more than the busiest client library holds (one long-poll
# and two stream reads per running command), and leaves the rest of the descriptors (and the
# memory each held request takes) to everyone else.
MOST = 1000
SETTING = "HUTCH_MAX_REQUESTS_PER_ORG"


def raise_open_file_limit() -> None:
    """The server process's soft RLIMIT_NOFILE up to its hard one (as the local driver does for
    its pidfds, and Go programs at start): a shell or a plain unit gives 1024, and ~1,000 held
    connections then stopped the server accepting any. Process-wide, so for ``run_server``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def default_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MOST
    return max(1, min(MOST, soft // 4))


class AtOnce:
    """Requests under way per organization, on this server."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}

    def held(self, org_id: str) -> int:
        return self._held.get(org_id, 0)

    @contextlib.contextmanager
    def slot(self, org_id: str) -> Iterator[None]:
        """One request of ``org_id`` under way; refused (429, its connection to be closed) past
        the organization's share."""
        held = self._held.get(org_id, 0)
        if held >= self.limit:
            raise RateLimited(
                f"requests at once: organization {org_id} has {held} requests under way on this server, "
                f"the most it may ({SETTING}={self.limit}); end some (long-polls, stream reads, "
                "terminals, downloads) or retry when they end", retry_after=1, close=True)
        self._held[org_id] = held + 1
        try:
            yield
        finally:
            if (left := self._held[org_id] - 1) > 0:
                self._held[org_id] = left
            else:
                del self._held[org_id]
