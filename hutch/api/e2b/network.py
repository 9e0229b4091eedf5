"""E2B's egress options (a create's ``allow_internet_access`` and ``network``, and
``update_network``'s body) as hutch's network spec (core/egress.py). hutch has an on/off
network narrowed by an allow-list or a deny-list, never both, so

- ``denyOut`` holding all traffic (``0.0.0.0/0``; also what ``allow_internet_access: false``
  means in E2B) with an ``allowOut`` list: the network on, limited to that list;
- all traffic denied and no list: no network;
- an ``allowOut`` list, with or without a ``denyOut`` of particular destinations: the network
  limited to that list (allow beats deny, as in E2B; hutch never opens more than was listed,
  where E2B would add nothing to an open network with it);
- a ``denyOut`` of particular destinations alone: the network on, without them (IPv4
  addresses and CIDRs: a host name is refused, hutch denies addresses only);
- neither: at a create, ``allow_internet_access`` decides, off unless ``true`` (hutch's
  default); in an update, which replaces every rule as E2B's does, the network without rules.

``allowPublicTraffic`` is no egress option: control_routes.py keeps it (api/e2b/public.py).

Host masking, per-domain transforms, an egress proxy and custom DNS servers are refused naming
the field: hutch cannot keep them, and ignoring one would leave open what the caller meant to
close."""

from __future__ import annotations

from typing import Any

from hutch.core import egress
from hutch.core.errors import InvalidInput, NotSupported

ALL_TRAFFIC = egress.ALL_TRAFFIC
_NOT_OFFERED = {"maskRequestHost": "host masking", "rules": "per-domain request transforms",
                "egressProxy": "an egress proxy", "dnsServers": "custom DNS servers",
                "httpsPorts": "TLS ports on sandbox URLs"}
_KNOWN = {"allowOut", "denyOut", "allowPublicTraffic", *_NOT_OFFERED}
# update_network's body (SandboxNetworkUpdateConfig): the egress fields only.
_UPDATE_NOT_OFFERED = {k: v for k, v in _NOT_OFFERED.items() if k in ("rules", "egressProxy", "dnsServers")}
_UPDATE_KNOWN = {"allowOut", "denyOut", "allow_internet_access", *_UPDATE_NOT_OFFERED}


def _strings(net: dict[str, Any], field: str) -> list[str]:
    value = net.get(field)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"network.{field}: expected a list of addresses, CIDRs or host names", field=f"network.{field}")
    return [v.strip() for v in value]


def _internet(value: object) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise InvalidInput("allow_internet_access: expected true or false", field="allow_internet_access")
    return value


def _fields(network: object, known: set[str], not_offered: dict[str, str]) -> dict[str, Any]:
    if network is None:
        network = {}
    if not isinstance(network, dict):
        raise InvalidInput("network: expected an object", field="network")
    unknown = sorted(set(network) - known)
    if unknown:
        raise InvalidInput(f"network.{unknown[0]}: not a field of a sandbox's network", field=f"network.{unknown[0]}")
    for field, what in not_offered.items():
        if network.get(field):
            raise NotSupported(f"network.{field}: hutch does not offer {what} on the E2B wire", field=f"network.{field}")
    return network


def _rules(internet: bool | None, network: dict[str, Any]) -> tuple[bool, tuple[str, ...], tuple[str, ...]] | None:
    """(enabled, allow, deny) as hutch keeps them; None: no rule given, the caller decides."""
    allow, deny = _strings(network, "allowOut"), _strings(network, "denyOut")
    if allow:
        try:
            return True, egress.parse_allow(allow), ()
        except InvalidInput as err:
            message = err.message.replace(egress.FIELD, "network.allowOut", 1)
            raise InvalidInput(message, field="network.allowOut") from None
    if ALL_TRAFFIC in deny or internet is False:
        return False, (), ()
    if deny:
        try:
            return True, (), egress.parse_deny(deny)
        except InvalidInput as err:
            message = err.message.replace(egress.DENY_FIELD, "network.denyOut", 1)
            if "not host names" in message:  # valid in E2B, not kept by hutch
                raise NotSupported(message, field="network.denyOut") from None
            raise InvalidInput(message, field="network.denyOut") from None
    return None


def hutch_network(internet: object, network: object) -> dict[str, Any] | None:
    """hutch's ``network`` for a create (None: hutch's default, no network)."""
    internet = _internet(internet)
    network = _fields(network, _KNOWN, _NOT_OFFERED)
    public = network.get("allowPublicTraffic")
    if public is not None and not isinstance(public, bool):
        raise InvalidInput("network.allowPublicTraffic: expected true or false", field="network.allowPublicTraffic")
    rules = _rules(internet, network)
    if rules is None:
        return {"enabled": True} if internet else None
    enabled, allow, deny = rules
    if not enabled:
        return None
    return {"enabled": True, **({"allow": list(allow)} if allow else {}), **({"deny": list(deny)} if deny else {})}


def hutch_update(body: object) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
    """update_network's body as (enabled, allow, deny): every rule replaced, none given is the
    network without rules (E2B's update clears what it leaves out)."""
    if not isinstance(body, dict):
        raise InvalidInput("network: expected an object", field="network")
    internet = _internet(body.get("allow_internet_access"))
    network = _fields(body, _UPDATE_KNOWN, _UPDATE_NOT_OFFERED)
    rules = _rules(internet, network)
    return rules if rules is not None else (True, (), ())


def e2b_network(allow: tuple[str, ...], deny: tuple[str, ...]) -> dict[str, list[str]] | None:
    """A sandbox's rules as E2B's info shows them: hutch's allow-list is E2B's allowOut with all
    other traffic denied."""
    if allow:
        return {"allowOut": list(allow), "denyOut": [ALL_TRAFFIC]}
    if deny:
        return {"denyOut": list(deny)}
    return None
