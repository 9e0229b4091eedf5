"""network.allow's pure parts (core/egress.py) and the refresh logic of drivers/egress.py,
with the resolver replaced (the real one is exercised by the isolation tests)."""

from __future__ import annotations

import pytest

from hutch.core.egress import parse_allow, parse_deny
from hutch.core.errors import InvalidInput
from hutch.drivers import egress
from hutch.drivers.local import network


def test_entries_are_normalised_and_deduplicated() -> None:
    assert parse_allow(["PyPI.org.", "10.1.2.3", "10.0.0.0/8", "pypi.org", "10.1.0.0/16"]) == (
        "pypi.org", "10.1.2.3/32", "10.0.0.0/8", "10.1.0.0/16")


@pytest.mark.parametrize("bad", [["a" * 64 + ".com"], ["x..y"], ["-x.com"], ["300.1.1.1"], ["10.0.0.0/33"], [5]])
def test_bad_entries_name_the_field(bad: list) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_allow(bad)
    assert err.value.field == "network.allow"


async def test_a_refresh_applies_changes_only_and_keeps_addresses_of_names_that_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: dict[str, set[str] | Exception] = {"a.test": {"1.1.1.1/32"}, "b.test": {"2.2.2.2/32"}}

    async def fake(name: str) -> set[str]:
        got = answers[name]
        if isinstance(got, Exception):
            raise got
        return got

    monkeypatch.setattr(egress, "_addresses", fake)
    applied: list[tuple[str, list[str]]] = []

    async def apply(sid: str, resolved: egress.Resolved) -> None:
        applied.append((sid, egress.flatten(resolved)))

    lists = egress.AllowLists(apply, interval=3600)
    first = await lists.first("sbx_1", ["a.test", "b.test", "10.0.0.0/8"])
    assert first == {"a.test": ["1.1.1.1/32"], "b.test": ["2.2.2.2/32"], "10.0.0.0/8": ["10.0.0.0/8"]}
    await lists.refresh()
    assert applied == []  # nothing changed: no rules rewritten
    answers["a.test"] = {"3.3.3.3/32"}
    answers["b.test"] = OSError("resolver down")
    await lists.refresh()
    assert applied == [("sbx_1", ["10.0.0.0/8", "2.2.2.2/32", "3.3.3.3/32"])]  # b.test kept its address
    lists.forget("sbx_1")
    answers["a.test"] = {"4.4.4.4/32"}
    await lists.refresh()
    assert len(applied) == 1
    await lists.close()


async def test_an_adopted_list_keeps_each_names_own_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    # A restarted server adopts the per-name addresses it saved: a name that then fails to
    # resolve keeps its own addresses only, not every address of the list.
    async def fake(name: str) -> set[str]:
        if name == "b.test":
            raise OSError("resolver down")
        return {"5.5.5.5/32"}

    monkeypatch.setattr(egress, "_addresses", fake)
    applied: list[list[str]] = []

    async def apply(sid: str, resolved: egress.Resolved) -> None:
        applied.append(egress.flatten(resolved))

    lists = egress.AllowLists(apply, interval=3600)
    lists.adopt("sbx_2", {"a.test": ["1.1.1.1/32"], "b.test": ["2.2.2.2/32"]})
    await lists.refresh()
    assert applied == [["2.2.2.2/32", "5.5.5.5/32"]]  # not 1.1.1.1 kept under b.test
    await lists.close()


async def test_a_name_that_does_not_resolve_at_create_is_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake(name: str) -> set[str]:
        raise OSError("Name or service not known")

    monkeypatch.setattr(egress, "_addresses", fake)
    with pytest.raises(InvalidInput, match=r"nope\.test"):
        await egress.resolve(["nope.test"])


def test_private_ranges_are_denied_by_default() -> None:
    from hutch.core.egress import denied_ranges

    denied = denied_ranges()
    for cidr in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"):
        assert cidr in denied


def test_an_operator_permits_part_of_a_private_range_only() -> None:
    import ipaddress

    from hutch.core.egress import denied_ranges

    denied = [ipaddress.ip_network(c) for c in denied_ranges(permit="10.1.0.0/16")]
    assert not any(ipaddress.ip_address("10.1.2.3") in n for n in denied)
    assert any(ipaddress.ip_address("10.2.0.1") in n for n in denied)
    assert any(ipaddress.ip_address("169.254.169.254") in n for n in denied)
    with pytest.raises(ValueError, match=r"HUTCH_SANDBOX_EGRESS_PERMIT: 169\.254\.0\.0/16 is not inside a private range"):
        denied_ranges(permit="169.254.0.0/16")
    with pytest.raises(ValueError, match="HUTCH_SANDBOX_EGRESS_DENY: 'nope' is not an IPv4 CIDR"):
        denied_ranges(deny="nope")
    with pytest.raises(ValueError, match="IPv6 is always denied"):
        denied_ranges(permit="fd00::/8")


def test_a_deny_list_takes_ipv4_networks_only_normalised_once_each() -> None:
    assert parse_deny(["192.0.2.9", " 198.51.100.7/24 ", "192.0.2.9/32"]) == ("192.0.2.9/32", "198.51.100.0/24")
    for value, words in ((["example.com"], "not host names"), (["2001:db8::1"], "IPv4 only"), ([], "at least one"),
                         ("192.0.2.9", "expected a list"), ([f"10.0.0.{i}" for i in range(65)], "at most 64")):
        with pytest.raises(InvalidInput, match=words) as err:
            parse_deny(value)
        assert err.value.field == "network.deny"


def test_a_sandboxs_chain_rejects_what_it_denies_before_anything_returns() -> None:
    """Only connections marked with this generation skip the checks; a deny-list's entries are
    rejected before anything else returns, DNS included; an allow-list ends in rejections."""
    deny = network.rules_chain(5, allow=None, deny=["192.0.2.0/24"], generation=3)
    mark = network._generation_mark(3)
    assert deny[0] == ":HUTCH-A5 - [0:0]"
    assert all(mark in line for line in deny[1:3])
    assert [line.split(" -d ")[1] for line in deny[3:5]] == ["192.0.2.0/24 -p tcp -j REJECT --reject-with tcp-reset",
                                                             "192.0.2.0/24 -j REJECT --reject-with icmp-admin-prohibited"]
    assert deny[5:] == ["-A HUTCH-A5 -j RETURN"]
    allow = network.rules_chain(5, allow=["192.0.2.7/32"], deny=[], generation=3)
    assert not [line for line in allow if "ESTABLISHED" in line and mark not in line]
    assert "-A HUTCH-A5 -d 192.0.2.7/32 -j RETURN" in allow and allow[-1].endswith("icmp-admin-prohibited")
    assert network._generation_mark(3) != network._generation_mark(4)


def test_an_entry_that_is_not_a_network_never_reaches_iptables(monkeypatch: pytest.MonkeyPatch) -> None:
    def touched() -> None:
        raise AssertionError("the firewall was touched")

    monkeypatch.setattr(network, "ensure_firewall", touched)
    with pytest.raises(InvalidInput, match="is not an IPv4 address or CIDR") as err:
        network.set_rules(5, allow=None, deny=["192.0.2.9/32\n-A HUTCH-ALLOW -j ACCEPT"])
    assert err.value.field == "network.deny"
