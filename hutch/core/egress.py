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
DENY_FIELD = "network.deny"
ALL_TRAFFIC = "0.0.0.0/0"
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


def parse_deny(value: object) -> tuple[str, ...]:
    """``network.deny``: IPv4 addresses and CIDRs a network may not reach (a deny-list; the rest
    is open, less what the server denies every sandbox). Host names are refused: a name's
    addresses are whatever a resolver says at the moment, so a deny by name would leave open
    the addresses it moves to, a wall in name only."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"{DENY_FIELD}: expected a list of IPv4 addresses or CIDRs, such as [\"203.0.113.0/24\"]",
                           field=DENY_FIELD)
    if not value:
        raise InvalidInput(f"{DENY_FIELD}: give at least one destination, or leave it out", field=DENY_FIELD)
    if len(value) > MAX_ENTRIES:
        raise InvalidInput(f"{DENY_FIELD}: at most {MAX_ENTRIES} entries, got {len(value)}", field=DENY_FIELD)
    out: list[str] = []
    for raw in value:
        entry = _entry(raw.strip(), DENY_FIELD)
        if not is_network(entry):
            raise InvalidInput(f"{DENY_FIELD}: {raw!r}: a deny-list takes IPv4 addresses and CIDRs, not host names "
                               "(a name's addresses change); to reach only some names use network.allow",
                               field=DENY_FIELD)
        if entry not in out:
            out.append(entry)
    return tuple(out)


def _entry(raw: str, field: str = FIELD) -> str:
    if any(c in raw for c in ":/") or raw.replace(".", "").isdigit():
        try:
            net = ipaddress.ip_network(raw, strict=False)
        except ValueError as err:
            raise InvalidInput(f"{field}: {raw!r} is not an address or CIDR ({err})", field=field) from None
        if net.version != 4:
            raise InvalidInput(f"{field}: {raw!r}: sandboxes have IPv4 only", field=field)
        return str(net)
    name = raw.lower().rstrip(".")
    if "*" in name:
        raise InvalidInput(f"{field}: {raw!r}: wildcards are not supported; list each host name", field=field)
    if not name or len(name) > 253 or not _HOSTNAME.match(name):
        raise InvalidInput(f"{field}: {raw!r} is not a host name, IPv4 address or CIDR", field=field)
    return name


# What a sandbox with network may never reach, on every driver. Always: "this network",
# loopback, link-local (cloud metadata at 169.254.169.254), multicast and reserved ranges.
ALWAYS_DENIED = ("0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4")
# By default also the private ranges (RFC 1918) and carrier-grade NAT (RFC 6598): a host's LAN,
# its other services and other drivers' sandboxes live there. An operator whose sandboxes must
# reach a private range names it in HUTCH_SANDBOX_EGRESS_PERMIT (only these can be permitted).
PRIVATE = ("10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16")
PERMIT_SETTING = "HUTCH_SANDBOX_EGRESS_PERMIT"
DENY_SETTING = "HUTCH_SANDBOX_EGRESS_DENY"


def parse_cidrs(setting: str, text: str) -> list[ipaddress.IPv4Network]:
    """A comma-separated list of IPv4 CIDRs from an operator setting; a ValueError names it."""
    out: list[ipaddress.IPv4Network] = []
    for raw in (part.strip() for part in text.split(",")):
        if not raw:
            continue
        try:
            net = ipaddress.ip_network(raw, strict=False)
        except ValueError as err:
            raise ValueError(f"{setting}: {raw!r} is not an IPv4 CIDR ({err})") from None
        if not isinstance(net, ipaddress.IPv4Network):
            raise ValueError(f"{setting}: {raw!r}: sandboxes have IPv4 only (IPv6 is always denied)")
        out.append(net)
    return out


def denied_ranges(permit: str = "", deny: str = "") -> list[str]:
    """The IPv4 ranges a sandbox's outbound traffic is dropped to, as CIDRs: the always-denied
    ones, the private ones minus what ``permit`` (HUTCH_SANDBOX_EGRESS_PERMIT) carves out, and
    ``deny`` (HUTCH_SANDBOX_EGRESS_DENY). A permitted range outside PRIVATE is an error: the
    always-denied ranges are never opened."""
    permitted = parse_cidrs(PERMIT_SETTING, permit)
    private = [ipaddress.IPv4Network(c) for c in PRIVATE]
    for net in permitted:
        if not any(net.subnet_of(p) for p in private):
            raise ValueError(f"{PERMIT_SETTING}: {net} is not inside a private range "
                             f"({', '.join(PRIVATE)}); only those can be permitted")
    remaining: list[ipaddress.IPv4Network] = []
    for block in private:
        pieces = [block]
        for net in permitted:
            pieces = [rest for piece in pieces for rest in _without(piece, net)]
        remaining.extend(pieces)
    extra = parse_cidrs(DENY_SETTING, deny)
    return [*ALWAYS_DENIED, *(str(n) for n in remaining), *(str(n) for n in extra)]


def _without(block: ipaddress.IPv4Network, hole: ipaddress.IPv4Network) -> list[ipaddress.IPv4Network]:
    if hole.supernet_of(block):
        return []
    if not hole.subnet_of(block):
        return [block]
    return list(block.address_exclude(hole))


def is_network(entry: str) -> bool:
    """A normalised entry that needs no resolving."""
    return "/" in entry


def hostnames(entries: Sequence[str]) -> list[str]:
    return [e for e in entries if not is_network(e)]
