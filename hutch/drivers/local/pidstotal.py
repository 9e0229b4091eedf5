"""The pids every sandbox of a server may hold together: ``pids.max`` on the instance's cgroup
(``hutch/<instance>``, cgroups.py), above every sandbox's own limit.

Each sandbox has its own pids limit (1024 unless asked), but the host has one
``kernel.pid_max`` (which counts threads): ~32 sandboxes of one tenant, each a fork bomb well
within its own limit, took every pid of a host with the default 32768, and then the server,
every other sandbox and the host's own services could not fork. The bound leaves a reserve
for the host: a quarter of pid_max, at least ``RESERVE_MIN``. ``HUTCH_SANDBOX_PIDS_TOTAL`` sets
it instead (a node agent reads the same name).

The server's own processes (and ``ip``, and the helper until its child joins a sandbox) are
not in the instance's cgroup, and joining a cgroup is never refused for its limit (only a fork
is): at the bound a sandbox's pid 1 is still launched (hutch-nsexec forks it before it joins),
a command still starts through the helper (its child joins the leaf, then execs), and destroys
kill and remove as before. What fails are forks inside sandboxes, until room comes back.

One organization's sandboxes, each a fork bomb within its own limit, filled that bound, and
then every other organization's sandbox could not fork. So each organization's sandboxes hold
at most a share of it together (``ORG_SETTING``; unset, half of it), in a cgroup of their own
between the instance's and theirs (cgroups.py): no single organization can take every pid.
The kernel has no guarantee to give instead (pids has a max, no min): two organizations at
their share together still fill a bound of twice it; a smaller share leaves room for more.
"""

from __future__ import annotations

SETTING = "HUTCH_SANDBOX_PIDS_TOTAL"
MINIMUM = 16  # a few sandboxes' pid 1s and a command each
RESERVE_MIN = 4096
ORG_SETTING = "HUTCH_ORG_PIDS"


def pid_max() -> int:
    with open("/proc/sys/kernel/pid_max") as fh:
        return int(fh.read())


def default(host_pid_max: int | None = None) -> int:
    """pid_max less the host's reserve (a quarter of it, at least RESERVE_MIN)."""
    most = pid_max() if host_pid_max is None else host_pid_max
    return max(MINIMUM, most - max(RESERVE_MIN, most // 4))


def parse(text: object) -> int:
    """The setting's value, or ValueError with a message naming it and what it takes."""
    try:
        value = int(str(text).strip())
    except ValueError:
        value = 0
    if isinstance(text, bool) or value < MINIMUM:
        raise ValueError(f"{SETTING}: expected a whole number of at least {MINIMUM}, got {text!r}")
    return value


def org_default(total: int) -> int:
    """An organization's share of ``total`` unless set: half of it."""
    return max(MINIMUM, total // 2)


def parse_org(text: object) -> int:
    """``ORG_SETTING``'s value, or ValueError with a message naming it and what it takes."""
    try:
        return parse(text)
    except ValueError:
        raise ValueError(f"{ORG_SETTING}: expected a whole number of at least {MINIMUM}, got {text!r}") from None


def check_share(org: int, total: int) -> None:
    """ValueError naming the setting if an organization's share is above the whole bound."""
    if org > total:
        raise ValueError(f"{ORG_SETTING}: expected at most the pids all sandboxes may hold together "
                         f"({SETTING}: {total}), got {org}")
