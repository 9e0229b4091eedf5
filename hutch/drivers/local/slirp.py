"""Outbound network for rootless sandboxes: slirp4netns and egress rules in the sandbox.

A server that is not root can make no veth and no host firewall rule (network.py). A
rootless sandbox asked for network instead gets a ``tap0`` served by slirp4netns, a
user-mode TCP/IP stack running as the server's user: the sandbox's packets become
ordinary sockets of that user on the host. What such a socket may reach is decided
inside the sandbox's own network namespace, where the launcher loads these rules (as
the only holder of CAP_NET_ADMIN there, before the sandbox user exists):

- DNS to slirp's resolver (10.0.2.3) passes; the rest of slirp's 10.0.2.0/24 does not
  (10.0.2.2 would be the host's loopback; slirp4netns also runs with
  ``--disable-host-loopback``);
- the host's own addresses (every address of every interface, read at creation) and what
  core/egress.py denies every sandbox: link-local (cloud metadata 169.254.169.254),
  loopback, multicast, reserved, and by default the private ranges (RFC 1918) and CGNAT
  (less ``HUTCH_SANDBOX_EGRESS_PERMIT``, plus ``HUTCH_SANDBOX_EGRESS_DENY``) are rejected;
  slirp's resolver forwards DNS to the host's name servers, so those need no opening;
- with ``network.allow``, only the listed addresses pass, through the ``HUTCH-ALLOW``
  chain (anything else is rejected: a TCP reset); a refresh of its names replaces that
  chain whole from the server, whose helper enters the sandbox's user and network
  namespaces (its user owns them) to run iptables-restore (``set_allowed``);
- everything else passes. There is no IPv6 (slirp4netns without ``--enable-ipv6``).

slirp4netns runs under its seccomp filter (``--enable-seccomp``) in a session of its own,
so it outlives a restarting server as the sandbox does; the driver kills it with the
sandbox. Not with ``--enable-sandbox``: that needs slirp4netns to be root in the
sandbox's user namespace, where only the sandbox user exists ("setegid(0)" fails). So
it runs as the server's user with the host's file system in view: a compromise of its
user-mode TCP/IP stack (libslirp) by a sandbox's packets would be one of that user.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from hutch.core.errors import DriverFailure, NotSupported
from hutch.drivers.local.network import denied

DNS = "10.0.2.3"
SLIRP_NET = "10.0.2.0/24"
TAP = "tap0"
READY_TIMEOUT = 10.0
_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def check_available(field: str = "network.enabled") -> None:
    missing = [tool for tool in ("slirp4netns", "iptables-restore") if shutil.which(tool, path=_PATH) is None]
    if missing:
        raise NotSupported(f"{field}: a server without root gives sandboxes network through slirp4netns "
                           f"and in-sandbox iptables rules; missing {', '.join(missing)} "
                           f"(apt-get install slirp4netns iptables)", field=field)
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        raise NotSupported(f"{field}: a server without root needs /dev/net/tun to be usable by its user "
                           "for slirp4netns (chmod 0666 /dev/net/tun, as udev sets it on Debian)", field=field)



def host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=False,
                         env={"PATH": _PATH}).stdout
    try:
        return sorted({a["local"] for link in json.loads(out or "[]") for a in link.get("addr_info", []) if "local" in a})
    except (ValueError, KeyError, TypeError):
        return []


def egress_rules(*, outbound: bool = True, allow: list[str] | None = None) -> bytes:
    """The iptables-restore input for a sandbox's own network namespace. Without
    ``outbound`` (a port only) nothing leaves but replies to connections made to it;
    with ``allow`` (CIDRs) nothing but those."""
    reject = "-j REJECT --reject-with icmp-net-prohibited"
    head = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD DROP [0:0]", ":OUTPUT ACCEPT [0:0]",
            "-A OUTPUT -o lo -j ACCEPT"]
    if not outbound:
        return ("\n".join([*head, "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
                           f"-A OUTPUT {reject}", "COMMIT"]) + "\n").encode()
    lines = [*head,
             f"-A OUTPUT -d {DNS}/32 -p udp --dport 53 -j ACCEPT",
             f"-A OUTPUT -d {DNS}/32 -p tcp --dport 53 -j ACCEPT"]
    for cidr in [SLIRP_NET, *denied(), *(f"{a}/32" for a in host_addresses())]:
        lines.append(f"-A OUTPUT -d {cidr} {reject}")
    if allow is not None:
        lines += [f"-A OUTPUT -j {ALLOW_CHAIN}", *_allow_chain(allow)[1:]]
        lines.insert(1, f":{ALLOW_CHAIN} - [0:0]")
    lines.append("COMMIT")
    return ("\n".join(lines) + "\n").encode()


ALLOW_CHAIN = "HUTCH-ALLOW"


def _allow_chain(cidrs: list[str]) -> list[str]:
    c = ALLOW_CHAIN
    return [f":{c} - [0:0]", f"-A {c} -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN",
            *(f"-A {c} -d {cidr} -j RETURN" for cidr in cidrs),
            f"-A {c} -p tcp -j REJECT --reject-with tcp-reset", f"-A {c} -j REJECT --reject-with icmp-net-prohibited"]


def set_allowed(helper: Path, init_pid: int, cidrs: list[str]) -> None:
    """Replace a live rootless sandbox's allow chain (its names resolved anew): the helper
    joins its user and network namespaces (ours) and loads the chain as at launch."""
    rules = "\n".join(["*filter", *_allow_chain(cidrs), "COMMIT"]) + "\n"
    proc = subprocess.run([str(helper), "netfilter", "--pid", str(init_pid)], input=rules, capture_output=True,
                          text=True, check=False, env={"PATH": _PATH})
    if proc.returncode != 0:
        raise DriverFailure(f"updating the allow-list of the sandbox with pid {init_pid} failed: "
                            f"{proc.stderr.strip()[-300:]}")


def resolv_conf() -> str:
    return f"nameserver {DNS}\n"


def start(init_pid: int, api_socket: Path | None = None) -> subprocess.Popen[bytes]:
    """slirp4netns for the sandbox whose pid 1 is ``init_pid``; returns once tap0 is up.
    ``api_socket``: where it listens for port forwards (a private directory: whoever
    reaches the socket can expose the sandbox's ports)."""
    ready_r, ready_w = os.pipe()
    api = [f"--api-socket={api_socket}"] if api_socket is not None else []
    # Its log goes to an unlinked file, not a pipe: nobody reads a pipe once it is up,
    # and a full pipe would stop slirp4netns (and the sandbox's network) at its next line.
    with tempfile.TemporaryFile() as log:
        try:
            proc = subprocess.Popen(
                ["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-seccomp",
                 f"--ready-fd={ready_w}", *api, f"--userns-path=/proc/{init_pid}/ns/user",
                 str(init_pid), TAP],
                env={"PATH": _PATH}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                pass_fds=(ready_w,), start_new_session=True)
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
        try:
            deadline = time.monotonic() + READY_TIMEOUT
            while time.monotonic() < deadline and proc.poll() is None:
                if select.select([ready_r], [], [], 0.05)[0]:
                    if os.read(ready_r, 1):
                        return proc
                    break  # closed without a word: it failed
        finally:
            os.close(ready_r)
        proc.kill()
        proc.wait()
        log.seek(0)
        said = log.read().decode(errors="replace").strip()[-1000:]
    raise DriverFailure(f"slirp4netns did not come up: {said or 'no output'}")


def forward(api_socket: Path, guest_port: int) -> int:
    """Forward a free port on the host's loopback to ``guest_port`` of the sandbox (its
    tap0 address); returns the host port. Blocking: one request on slirp4netns's API."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # a free port, then handed to slirp
        probe.bind(("127.0.0.1", 0))
        host_port = probe.getsockname()[1]
    request = {"execute": "add_hostfwd", "arguments": {"proto": "tcp", "host_addr": "127.0.0.1",
                                                       "host_port": host_port, "guest_port": guest_port}}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as api:
        api.settimeout(READY_TIMEOUT)
        api.connect(str(api_socket))
        api.sendall(json.dumps(request).encode())
        api.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := api.recv(4096):
            reply += chunk
    try:
        answer = json.loads(reply)
    except ValueError:
        answer = {"error": reply.decode(errors="replace")}
    if "error" in answer:
        raise DriverFailure(f"slirp4netns would not forward port {guest_port}: {answer['error']}")
    return host_port
