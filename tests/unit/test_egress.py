"""network.allow's pure parts (core/egress.py) and the refresh logic of drivers/egress.py,
with the resolver replaced (the real one is exercised by the isolation tests)."""

from __future__ import annotations

import pytest

from hutch.core.egress import parse_allow
from hutch.core.errors import InvalidInput
from hutch.drivers import egress


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
