"""``network.allow``: the destinations an enabled network is limited to (hutch's extension).

Entries are host names or IPv4 addresses/CIDRs. Pure: the server resolves host names
(drivers/egress.py) and the drivers turn the addresses into firewall rules. An allow-list
only ever narrows: what a sandbox may never reach (the host, other sandboxes, link-local
and metadata addresses, HUTCH_SANDBOX_EGRESS_DENY) stays unreachable even when listed.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from hutch.core.errors import InvalidInput

MAX_ENTRIES = 64
FIELD = "network.allow"
_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*\.?$")


def parse_allow(value: object) -> tuple[str, ...]:
    """The normalised entries (host names lower-cased, networks as CIDRs), in order, once each."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"{FIELD}: expected a list of host names and IPv4 addresses or CIDRs, "
                           f"such as [\"pypi.org\", \"10.0.0.0/8\"]", field=FIELD)
    if not value:
        raise InvalidInput(f"{FIELD}: give at least one destination, or leave it out for an unrestricted network",
                           field=FIELD)
    if len(value) > MAX_ENTRIES:
        raise InvalidInput(f"{FIELD}: at most {MAX_ENTRIES} entries, got {len(value)}", field=FIELD)
    out: list[str] = []
    for raw in value:
        entry = _entry(raw.strip())
        if entry not in out:
            out.append(entry)
    return tuple(out)


def _entry(raw: str) -> str:
    if any(c in raw for c in ":/") or raw.replace(".", "").isdigit():
        try:
            net = ipaddress.ip_network(raw, strict=False)
        except ValueError as err:
            raise InvalidInput(f"{FIELD}: {raw!r} is not an address or CIDR ({err})", field=FIELD) from None
        if net.version != 4:
            raise InvalidInput(f"{FIELD}: {raw!r}: sandboxes have IPv4 only", field=FIELD)
        return str(net)
    name = raw.lower().rstrip(".")
    if "*" in name:
        raise InvalidInput(f"{FIELD}: {raw!r}: wildcards are not supported; list each host name", field=FIELD)
    if not name or len(name) > 253 or not _HOSTNAME.match(name):
        raise InvalidInput(f"{FIELD}: {raw!r} is not a host name, IPv4 address or CIDR", field=FIELD)
    return name


def is_network(entry: str) -> bool:
    """A normalised entry that needs no resolving."""
    return "/" in entry


def hostnames(entries: Sequence[str]) -> list[str]:
    return [e for e in entries if not is_network(e)]
