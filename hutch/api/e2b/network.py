"""E2B's egress options (a create's ``allow_internet_access`` and ``network``) as hutch's
network spec (core/egress.py): hutch has an on/off network narrowed by an allow-list, so

- ``denyOut`` holding all traffic (``0.0.0.0/0``; also what ``allow_internet_access: false``
  means in E2B) with an ``allowOut`` list: the network on, limited to that list;
- all traffic denied and no list: no network;
- an ``allowOut`` list alone: the network limited to it too (E2B adds nothing to an open
  network with it; hutch never opens more than was listed);
- neither: ``allow_internet_access`` decides, off unless ``true`` (hutch's default).

``allowPublicTraffic`` is no egress option: control_routes.py keeps it (api/e2b/public.py).

A deny-list of particular destinations, host masking, per-domain transforms, an egress proxy,
custom DNS servers are refused naming the field: hutch cannot keep them, and ignoring one would leave open what the caller meant to close."""

from __future__ import annotations

from typing import Any

from hutch.core import egress
from hutch.core.errors import InvalidInput, NotSupported

ALL_TRAFFIC = "0.0.0.0/0"
_NOT_OFFERED = {"maskRequestHost": "host masking", "rules": "per-domain request transforms",
                "egressProxy": "an egress proxy", "dnsServers": "custom DNS servers",
                "httpsPorts": "TLS ports on sandbox URLs"}
_KNOWN = {"allowOut", "denyOut", "allowPublicTraffic", *_NOT_OFFERED}


def _strings(net: dict[str, Any], field: str) -> list[str]:
    value = net.get(field)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"network.{field}: expected a list of addresses, CIDRs or host names", field=f"network.{field}")
    return [v.strip() for v in value]


def hutch_network(internet: object, network: object) -> dict[str, Any] | None:
    """hutch's ``network`` for a create (None: hutch's default, no network)."""
    if internet is not None and not isinstance(internet, bool):
        raise InvalidInput("allow_internet_access: expected true or false", field="allow_internet_access")
    if network is None:
        network = {}
    if not isinstance(network, dict):
        raise InvalidInput("network: expected an object", field="network")
    unknown = sorted(set(network) - _KNOWN)
    if unknown:
        raise InvalidInput(f"network.{unknown[0]}: not a field of a sandbox's network", field=f"network.{unknown[0]}")
    for field, what in _NOT_OFFERED.items():
        if network.get(field):
            raise NotSupported(f"network.{field}: hutch does not offer {what} on the E2B wire", field=f"network.{field}")
    public = network.get("allowPublicTraffic")
    if public is not None and not isinstance(public, bool):
        raise InvalidInput("network.allowPublicTraffic: expected true or false", field="network.allowPublicTraffic")
    allow, deny = _strings(network, "allowOut"), _strings(network, "denyOut")
    deny_all = ALL_TRAFFIC in deny or internet is False
    if any(d != ALL_TRAFFIC for d in deny):
        raise NotSupported("network.denyOut: hutch limits egress with an allow-list only; deny all traffic "
                           f"({ALL_TRAFFIC}) and list what may be reached in allowOut", field="network.denyOut")
    if allow:
        try:
            return {"enabled": True, "allow": list(egress.parse_allow(allow))}
        except InvalidInput as err:
            message = err.message.replace(egress.FIELD, "network.allowOut", 1)
            raise InvalidInput(message, field="network.allowOut") from None
    if deny_all:
        return None
    return {"enabled": True} if internet else None
