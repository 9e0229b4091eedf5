"""Sandbox networking for the local driver: a routed veth per sandbox, NAT out, nothing in.

Every sandbox starts in its own network namespace with loopback only. Asked for network
(or a port), it gets a veth pair: ``eth0`` inside with the address ``SUBNET[2 + n]/32``
(n: the sandbox uid's index in the uid range, unique among live sandboxes) and a default
route to a gateway address ``SUBNET[1]`` that no interface holds (its MAC is a permanent
neighbour entry: no ARP, no proxy ARP), and on the host ``hzn<n>`` (outbound network)
or ``hzp<n>`` (a port only) with a /32 route back. IPv6 is off on both ends.

The firewall (iptables, chains ``HUTCH-IN``/``HUTCH-FWD``/``HUTCH-NAT``, installed once):
- INPUT from any sandbox veth: only replies to connections the host opened (the port
  proxy); everything else to the host's own addresses and ports is dropped, whichever
  address it was sent to (its LAN address, a docker bridge, ...). A sandbox's 127.0.0.1
  is its own loopback.
- FORWARD into a sandbox veth: replies only, so no sandbox (or anyone) opens a
  connection to another sandbox. From ``hzp*``: nothing (a port without network is
  reachable only through the API's proxy). From ``hzn*``: DNS (udp/tcp 53, nothing else)
  to the name servers sandboxes are given (the host's, often a private address), then not
  to the sandbox subnet nor to what core/egress.py denies: link-local (cloud metadata
  169.254.169.254), loopback, multicast, reserved, and by default the private ranges (RFC
  1918) and CGNAT, less ``HUTCH_SANDBOX_EGRESS_PERMIT`` and plus ``HUTCH_SANDBOX_EGRESS_DENY``
  (comma-separated CIDRs); everything else is accepted and masqueraded.
- ``network.allow`` (an allow-list): ``HUTCH-FWD`` sends everything from ``hzn*`` through
  ``HUTCH-ALLOW`` first, which sends a listed sandbox's packets to its own chain
  ``HUTCH-A<n>``: replies, DNS to its name servers and the listed CIDRs return to
  ``HUTCH-FWD`` (whose drops still apply: a list narrows, never widens), anything else is
  rejected (a TCP reset: connect() fails at once). ``HUTCH-ALLOW`` and the ``HUTCH-A<n>``
  chains are never flushed by a server start, so a restarted server's sandboxes stay
  limited; each chain is replaced whole (iptables-restore) when its names resolve anew.
- ``network.deny`` (a deny-list) and a live sandbox's rules replaced (update_network): the same
  chain, ``rules_chain``: the denied CIDRs rejected first, then the allow-list if any, else
  back to ``HUTCH-FWD``; an update swaps the chain whole in one commit and marks the rules'
  generation on the connections they let through (see GENERATION_MASK).
Turning the first sandbox's network on sets ``net.ipv4.ip_forward=1`` (host-wide; the
FORWARD rules above only accept traffic from sandbox veths).

An address is handed out again once its sandbox is destroyed: the teardown deletes the host's
connection-tracking entries of the address, and the next set-up does before its veth exists
unless that teardown's mark says it was done (conntrack.py), so the ``ESTABLISHED,RELATED``
accepts above never carry a flow of the last holder's to the next one.

IPv6: sandboxes have none (disabled on both ends of every veth). As a second wall,
ip6tables drops every packet that comes in from or goes out to a sandbox veth (``hz+``), in
INPUT and FORWARD, so a sandbox that somehow got an IPv6 address still reaches nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

from hutch.core import egress
from hutch.core.errors import DriverFailure, InvalidInput
from hutch.drivers.local import conntrack, firewall_peers

SUBNET = ipaddress.ip_network(os.environ.get("HUTCH_SANDBOX_SUBNET", "10.213.0.0/16"))
GATEWAY = SUBNET[1]
PREFIX = "hz"
PUBLIC_DNS = ("1.1.1.1", "8.8.8.8")

ALLOW_CHAIN = "HUTCH-ALLOW"
log = logging.getLogger("hutch.drivers.local")
FIREWALL_LOCK = Path("/run/lock/hutch-firewall.lock")

_firewall_lock = threading.Lock()
_firewall_ready = False


def address(index: int) -> ipaddress.IPv4Address:
    if not 0 <= index < SUBNET.num_addresses - 3:
        raise DriverFailure(f"sandbox index {index} does not fit the sandbox subnet {SUBNET}")
    return SUBNET[2 + index]  # type: ignore[return-value]


def host_veth(index: int, outbound: bool) -> str:
    return f"{PREFIX}{'n' if outbound else 'p'}{index:x}"


def _run(*cmd: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    if check and proc.returncode != 0:
        raise DriverFailure(f"network setup failed: {' '.join(cmd[:4])}...: {proc.stderr.strip()[-500:]}")
    return proc


def _iptables(*args: str, check: bool = True) -> bool:
    return _run("iptables", "-w", *args, check=check).returncode == 0


def _ensure_rule(table: str, chain: str, *rule: str) -> None:
    if not _iptables("-t", table, "-C", chain, *rule, check=False):
        _iptables("-t", table, "-I", chain, "1", *rule)


def denied() -> list[str]:
    """What a sandbox with network may not reach (core/egress.py, with the operator's
    HUTCH_SANDBOX_EGRESS_PERMIT and _DENY; the server's Config refuses bad ones at start)."""
    try:
        return egress.denied_ranges(os.environ.get(egress.PERMIT_SETTING, ""), os.environ.get(egress.DENY_SETTING, ""))
    except ValueError as err:
        raise DriverFailure(str(err)) from None


def _ensure_ipv6_wall() -> None:
    """Drop every IPv6 packet from or to a sandbox veth (they have no IPv6: a second wall)."""
    if not Path("/proc/net/if_inet6").exists():
        return  # a kernel without IPv6: nothing to wall off
    for chain, rule in (("INPUT", ("-i", f"{PREFIX}+")), ("FORWARD", ("-i", f"{PREFIX}+")),
                        ("FORWARD", ("-o", f"{PREFIX}+")), ("OUTPUT", ("-o", f"{PREFIX}+"))):
        if _run("ip6tables", "-w", "-C", chain, *rule, "-j", "DROP", check=False).returncode != 0:
            _run("ip6tables", "-w", "-I", chain, "1", *rule, "-j", "DROP")


def ensure_firewall() -> None:
    """Install (or refresh) the chains and jumps; idempotent, once per process."""
    global _firewall_ready
    with _firewall_lock:
        if _firewall_ready:
            return
        if not Path("/usr/sbin/iptables").exists() and _run("sh", "-c", "command -v iptables", check=False).returncode:
            raise DriverFailure("sandbox networking needs iptables (apt-get install iptables)")
        with host_firewall_lock():
            install_firewall()
        _firewall_ready = True


@contextlib.contextmanager
def host_firewall_lock() -> Iterator[None]:
    """One installer at a time on this host: two processes starting together would each find
    a jump missing and both insert it (``-C`` then ``-I`` is not atomic)."""
    FIREWALL_LOCK.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(FIREWALL_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def install_firewall() -> None:
    """Replace the chains whole, each table in one iptables-restore commit. Other processes'
    sandboxes run while a server starts: flushing a chain and appending its rules one by one
    left them, between the flush and the last drop, with no wall at all (the chains are
    empty, the built-in chains' policy is ACCEPT): the host and the private ranges open while
    a start rewrote them (2,327 of 2,424 knocks got through during 79 installs;
    tests/adversarial/test_local_network.py). Declaring a
    chain in a ``--noflush`` restore empties and refills it in the same transaction."""
    est = "-m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"
    # The chains are every process's of this namespace: its walls and every live one's.
    walls = firewall_peers.strictest(firewall_peers.Walls(tuple(denied()), (str(SUBNET),), tuple(nameservers())))
    fwd = [f"-A HUTCH-FWD -o {PREFIX}+ {est}", f"-A HUTCH-FWD -o {PREFIX}+ -j DROP",
           f"-A HUTCH-FWD -i {PREFIX}p+ -j DROP", f"-A HUTCH-FWD -i {PREFIX}n+ -j {ALLOW_CHAIN}"]
    # Before the drops: the name servers are often private addresses (10.255.255.53 here).
    fwd += [f"-A HUTCH-FWD -i {PREFIX}n+ -d {ns}/32 -p {proto} --dport 53 -j ACCEPT"
            for ns in walls.nameservers for proto in ("udp", "tcp")]
    fwd += [f"-A HUTCH-FWD -i {PREFIX}n+ -d {cidr} -j DROP" for cidr in [*walls.subnets, *walls.denied]]
    fwd += [f"-A HUTCH-FWD -i {PREFIX}n+ -j ACCEPT", f"-A HUTCH-FWD -i {PREFIX}+ -j DROP"]
    _iptables("-N", ALLOW_CHAIN, check=False)  # not in the restore: live sandboxes' allow-lists stay
    _run("iptables-restore", "-w", "--noflush", stdin="\n".join([
        "*filter", ":HUTCH-IN - [0:0]", ":HUTCH-FWD - [0:0]",
        f"-A HUTCH-IN {est}", "-A HUTCH-IN -j DROP", *fwd, "COMMIT",
        "*nat", ":HUTCH-NAT - [0:0]", f"-A HUTCH-NAT -s {SUBNET} ! -o {PREFIX}+ -j MASQUERADE", "COMMIT",
    ]) + "\n")
    _ensure_rule("filter", "INPUT", "-i", f"{PREFIX}+", "-j", "HUTCH-IN")
    _ensure_rule("filter", "FORWARD", "-i", f"{PREFIX}+", "-j", "HUTCH-FWD")
    _ensure_rule("filter", "FORWARD", "-o", f"{PREFIX}+", "-j", "HUTCH-FWD")
    _ensure_rule("nat", "POSTROUTING", "-s", str(SUBNET), "-j", "HUTCH-NAT")
    _ensure_ipv6_wall()


def _sysctl_write(path: str, value: str) -> None:
    with contextlib.suppress(FileNotFoundError), open(path, "w") as fh:
        fh.write(value)


def setup(pid: int, index: int, *, outbound: bool) -> str:
    """Give the sandbox whose init is ``pid`` its veth; returns its address."""
    ensure_firewall()
    if outbound:
        _sysctl_write("/proc/sys/net/ipv4/ip_forward", "1")
    ip = address(index)
    host = host_veth(index, outbound)
    for stale in (host_veth(index, True), host_veth(index, False)):  # a restarted sandbox's
        _run("ip", "link", "del", stale, check=False)
    # Before the address is reachable: the flows an earlier holder of it left (a teardown
    # that never ran: a server killed first) must not become this sandbox's (conntrack.py).
    conntrack.forget_before_use(index, str(ip))
    _run("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", str(pid))
    try:
        _sysctl_write(f"/proc/sys/net/ipv6/conf/{host}/disable_ipv6", "1")
        _run("ip", "link", "set", host, "up")
        _run("ip", "route", "replace", f"{ip}/32", "dev", host)
        mac = link_mac(host)
        ns = f"--net=/proc/{pid}/ns/net"
        _run("nsenter", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
             "net.ipv6.conf.default.disable_ipv6=1", "net.ipv6.conf.eth0.disable_ipv6=1")
        _run("nsenter", ns, "ip", "-batch", "-", stdin="\n".join([
            f"addr add {ip}/32 dev eth0",
            "link set eth0 up",
            f"route add {GATEWAY} dev eth0 scope link",
            f"route add default via {GATEWAY} dev eth0",
            f"neigh replace {GATEWAY} lladdr {mac} dev eth0 nud permanent",
        ]) + "\n")
    except BaseException:
        _run("ip", "link", "del", host, check=False)
        raise
    return str(ip)


def _allow_chain(index: int) -> str:
    return f"HUTCH-A{index:x}"


# Connections a sandbox opened are marked (conntrack's mark, these bits) with the generation
# of the rules that let them through; only those of the rules now in force skip the checks.
# An update bumps the generation, so a connection opened under the old rules is judged anew
# by the new ones packet by packet: one to a destination they no longer allow is reset, not
# carried on because it was established. A refresh of the same rules keeps the generation (a
# name whose addresses rotated does not cut a download under way).
GENERATION_MASK = 0x0FFF0000


def _generation_mark(generation: int) -> str:
    return f"0x{((generation % 0xFFF) + 1) << 16:x}/0x{GENERATION_MASK:x}"


def rules_chain(index: int, *, allow: list[str] | None, deny: list[str], generation: int) -> list[str]:
    """Sandbox ``index``'s own chain (without its table line and COMMIT). ``allow`` (a list,
    possibly empty): only DNS to its name servers and these CIDRs; None: no allow-list. Then
    ``deny``'s CIDRs are rejected, DNS included, whatever else would pass; ``0.0.0.0/0`` there
    is no network at all. What is not rejected returns to HUTCH-FWD, whose drops still apply:
    neither list widens what every sandbox may reach."""
    chain, mark = _allow_chain(index), _generation_mark(generation)
    reject = ("-p tcp -j REJECT --reject-with tcp-reset", "-j REJECT --reject-with icmp-admin-prohibited")
    lines = [f":{chain} - [0:0]",
             f"-A {chain} -m conntrack --ctstate NEW -j CONNMARK --set-xmark {mark}",
             f"-A {chain} -m conntrack --ctstate ESTABLISHED,RELATED -m connmark --mark {mark} -j RETURN"]
    lines += [f"-A {chain} -d {cidr} {r}" for cidr in deny for r in reject]
    if allow is not None:
        for ns in nameservers():
            lines += [f"-A {chain} -d {ns}/32 -p {proto} --dport 53 -j RETURN" for proto in ("udp", "tcp")]
        lines += [f"-A {chain} -d {cidr} -j RETURN" for cidr in allow]
        lines += [f"-A {chain} {r}" for r in reject]
    else:
        lines.append(f"-A {chain} -j RETURN")
    return lines


def set_rules(index: int, *, allow: list[str] | None, deny: list[str], generation: int = 0) -> None:
    """Put sandbox ``index``'s rules in force, replacing any it had, in one iptables-restore
    commit: its chain emptied and refilled and, the first time, the jump to it, together, so
    no packet meets the chain half-written nor the sandbox without one."""
    # Each entry becomes part of a rule line: only an IPv4 network, as ipaddress writes it, gets
    # there (the callers checked them; a line break in one would be a rule of its own).
    allow, deny = (None if allow is None else _cidrs(allow, "network.allow")), _cidrs(deny, "network.deny")
    ensure_firewall()
    chain, veth = _allow_chain(index), host_veth(index, True)
    lines = ["*filter", *rules_chain(index, allow=allow, deny=deny, generation=generation)]
    if not _iptables("-C", ALLOW_CHAIN, "-i", veth, "-j", chain, check=False):
        lines.append(f"-A {ALLOW_CHAIN} -i {veth} -j {chain}")
    _run("iptables-restore", "-w", "--noflush", stdin="\n".join([*lines, "COMMIT"]) + "\n")


def _cidrs(entries: list[str], field: str) -> list[str]:
    out = []
    for entry in entries:
        try:
            out.append(str(ipaddress.IPv4Network(entry, strict=False)))
        except ValueError:
            raise InvalidInput(f"{field}: {entry!r} is not an IPv4 address or CIDR", field=field) from None
    return out


def set_allowed(index: int, cidrs: list[str]) -> None:
    """Limit sandbox ``index``'s outbound network to ``cidrs`` (and DNS to its name servers)."""
    set_rules(index, allow=cidrs, deny=[])


def clear_allowed(index: int) -> None:
    chain = _allow_chain(index)
    while _iptables("-D", ALLOW_CHAIN, "-i", host_veth(index, True), "-j", chain, check=False):
        pass
    if _iptables("-F", chain, check=False):
        _iptables("-X", chain, check=False)


def teardown(index: int) -> None:
    clear_allowed(index)
    for name in (host_veth(index, True), host_veth(index, False)):
        if link_exists(name):
            _run("ip", "link", "del", name, check=False)
    # After the veth is gone (the sandbox makes no new entry): its flows end with it, rather
    # than wait (up to 5 days) for the next sandbox given its address (conntrack.py). A failure
    # here leaves the destroy whole: the next set-up at this address forgets them or fails.
    try:
        conntrack.forget_released(index, str(address(index)))
    except (DriverFailure, OSError) as err:  # OSError: the mark (conntrack.FORGOTTEN) not written
        log.warning("%s", err)


# Links are asked of the kernel in this process's network namespace, not read from /sys:
# sysfs shows the namespace of whoever mounted it, and a node agent run in a cluster client's
# namespace (docs/node.md) sees the host's, where its veths do not show.

def link_mac(name: str) -> str:
    """The link's hardware address (SIOCGIFHWADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        answer = fcntl.ioctl(s.fileno(), 0x8927, struct.pack("256s", name.encode()[:15]))
    return ":".join(f"{b:02x}" for b in answer[18:24])


def link_exists(name: str) -> bool:
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


def nameservers() -> list[str]:
    return [line.split()[1] for line in resolv_conf().splitlines()]


def resolv_conf() -> str:
    """Name servers a sandbox can use: the host's, unless they are on the host itself
    (127.0.0.53 and friends: unreachable from a sandbox), then systemd-resolved's
    upstreams, then public resolvers."""
    for source in ("/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"):
        servers = []
        with contextlib.suppress(OSError):
            for line in Path(source).read_text().splitlines():
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    with contextlib.suppress(ValueError):
                        addr = ipaddress.ip_address(parts[1].split("%")[0])
                        if addr.version == 4 and not (addr.is_loopback or addr.is_link_local or addr in SUBNET):
                            servers.append(str(addr))
        if servers:
            return "".join(f"nameserver {s}\n" for s in servers[:3])
    return "".join(f"nameserver {s}\n" for s in PUBLIC_DNS)
