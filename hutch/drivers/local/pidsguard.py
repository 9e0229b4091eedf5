"""The sandbox-saturation guard: a fork bomb must not leave a sandbox unusable.

A command that starts a fork bomb in the background and ends (``b(){ b | b & }; b;
exit``) leaves the sandbox at its pids limit for ever: no later command can fork, so it
is unusable until destroyed (timeouts and cancel only reach commands still running).
Every second the guard reads the pids.events "max" counter (forks the limit refused) of
each sandbox that has a leaf besides pid 1's (an idle one has none, and nothing to end);
when it grew in two consecutive seconds, the leaf of an ended execution
(lingering with its background processes) holding the most processes is killed whole.
A running command is left to its timeout or a cancel: it still has a handle and an owner.
One burst that touches the limit once is left alone. The nomad plugin does the same with its
exec tags (containerd-driver/pidsguard.go).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from hutch.drivers.local.cgroups import Cgroups

log = logging.getLogger(__name__)

PERIOD = 1.0
SUSTAINED = 2  # consecutive periods with refused forks


class PidsGuard:
    def __init__(self, cgroups: Cgroups) -> None:
        self._cgroups = cgroups
        self._seen: dict[str, tuple[int, int]] = {}  # sandbox -> (refusals, periods rising)

    def check(self, sandboxes: Iterable[str], running: Callable[[str], set[str]]) -> list[tuple[str, str]]:
        """One period: the (sandbox, leaf) pairs to kill; ``running(sandbox)``: its leaves still
        running a command (spared)."""
        victims = []
        live = set(sandboxes)
        for sid in live:
            now = self._cgroups.fork_refusals(sid)
            last, rising = self._seen.get(sid, (now, 0))
            rising = rising + 1 if now > last else 0
            if rising >= SUSTAINED:
                rising = 0
                spared = running(sid) | {"init"}  # init: cgroup v2's leaf of pid 1, the sandbox itself
                counts = {leaf: len(self._cgroups.pids(sid, leaf)) for leaf in self._cgroups.leaves(sid)
                          if leaf not in spared}
                if counts:
                    leaf = max(counts, key=counts.__getitem__)
                    log.warning("sandbox %s: forks refused at its pids limit for %ds; ending execution leaf %s "
                                "(%d processes)", sid, SUSTAINED, leaf, counts[leaf])
                    victims.append((sid, leaf))
            self._seen[sid] = (now, rising)
        for gone in set(self._seen) - live:
            del self._seen[gone]
        return victims
