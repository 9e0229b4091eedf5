"""The replicas seam (core/replicas.py): what every adapter promises, then what only a shared
one (PostgreSQL) can show — owners seen across processes, leases that lapse, one winner per
take-over, a replica that learns it was claimed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest

from hutch.core import counters
from hutch.core.replicas import CURRENT_MARGIN, Owner, Replicas, SoleReplica, Tenant
from hutch.projections.replicas import PostgresReplicas
from tests.services import drop_database, fresh_database

LEASE = 0.5  # seconds: short, so a lapse takes no time


@pytest.fixture
async def database() -> AsyncIterator[str]:
    url, name = await fresh_database("replicas")
    try:
        yield url
    finally:
        await drop_database(name)


@pytest.fixture
async def started() -> AsyncIterator[list[Replicas]]:
    made: list[Replicas] = []
    yield made
    for r in made:
        await r.close()


@pytest.fixture(params=["sole", "postgres"])
async def one(request: pytest.FixtureRequest) -> AsyncIterator[Replicas]:
    name = None
    if request.param == "sole":
        replica: Replicas = SoleReplica("me", "http://me")
    else:
        url, name = await fresh_database("replicas")
        replica = PostgresReplicas(url, me="me", url="http://me", lease_seconds=LEASE)
    await replica.start()
    try:
        yield replica
    finally:
        await replica.close()
        if name is not None:
            await drop_database(name)


async def test_a_sandbox_this_replica_made_is_its_own(one: Replicas) -> None:
    await one.own("sbx_1")
    assert one.owns("sbx_1") and await one.mine("sbx_1")
    assert await one.renew() is True
    assert await one.claim_dead() == []  # nobody else, nothing to take over


async def test_it_counts_itself_among_the_live(one: Replicas) -> None:
    assert await one.live_count() == 1


async def test_an_ended_sandbox_has_no_owner(one: Replicas) -> None:
    await one.own("sbx_1")
    await one.disown("sbx_1")
    assert await one.mine("sbx_1")  # nobody else's: an unowned sandbox may be served anywhere
    assert await one.owner("sbx_1") is None


async def test_serialised_can_be_held_again_after_it_is_left(one: Replicas) -> None:
    for _ in range(2):
        async with one.serialised("quota:org_a"):
            pass
    with pytest.raises(RuntimeError):  # an error inside is the caller's, and the lock is left
        async with one.serialised("quota:org_a"):
            raise RuntimeError("inside")
    async with asyncio.timeout(5), one.serialised("quota:org_a"):
        pass


# -- shared: two replicas on one database ------------------------------------------------------

@pytest.fixture
async def pg(database: str, started: list[Replicas]) -> Callable[[str], asyncio.Future[PostgresReplicas]]:
    async def make(name: str) -> PostgresReplicas:
        replica = PostgresReplicas(database, me=name, url=f"http://{name}", lease_seconds=LEASE)
        await replica.start()
        started.append(replica)
        return replica
    return make  # type: ignore[return-value]


async def test_another_replica_sees_the_owner_and_its_address(pg: Callable[..., PostgresReplicas]) -> None:
    a, b = await pg("a"), await pg("b")
    await a.own("sbx_1")
    await a.set_handle("sbx_1", {"job_id": "hutch-x-sbx_1", "alloc_id": "a1"})
    assert not await b.mine("sbx_1")
    assert await b.owner("sbx_1") == Owner("a", "http://a", True)
    assert await b.foreign_handles() == [{"job_id": "hutch-x-sbx_1", "alloc_id": "a1"}]
    assert await a.foreign_handles() == []


async def test_a_lapsed_lease_is_taken_over_once_and_its_replica_learns_it(pg: Callable[..., PostgresReplicas]) -> None:
    a, b, c = await pg("a"), await pg("b"), await pg("c")
    await a.own("sbx_1")
    await a.set_handle("sbx_1", {"job_id": "j1", "alloc_id": "a1"})
    await a.own("sbx_2")
    assert await b.claim_dead() == []  # a's lease is still running
    await asyncio.sleep(LEASE + 0.2)
    assert await b.renew() and await c.renew()
    assert (await b.owner("sbx_1")).alive is False  # type: ignore[union-attr]
    claims = await asyncio.gather(b.claim_dead(), c.claim_dead())
    won = [cl for cl in claims if cl]
    assert len(won) == 1, claims  # one survivor wins; the other finds it claimed
    (claimed,) = won[0]
    assert claimed.dead_replica == "a"
    assert dict(claimed.sandboxes) == {"sbx_1": {"job_id": "j1", "alloc_id": "a1"}, "sbx_2": None}
    winner = b if claims[0] else c
    assert await winner.mine("sbx_1") and await winner.mine("sbx_2")
    assert await a.renew() is False  # it stalled past its lease: it must stop serving
    # Started again (same id): a live replica once more, owning nothing it lost.
    await a.start()
    assert await a.renew() is True
    assert not await a.mine("sbx_1")


async def test_a_replica_started_again_learns_whether_it_was_taken_over(pg: Callable[..., PostgresReplicas]) -> None:
    """What its previous run placed ahead is a survivor's to end once that run was claimed
    (the nomad driver then takes none of its idle warm pool jobs back: adoption.py)."""
    a, b = await pg("a"), await pg("b")
    assert not a.taken_over and not b.taken_over  # never registered before
    await a.start()  # a restart within its lease: nobody claimed it
    assert not a.taken_over and await b.claim_dead() == []
    await asyncio.sleep(LEASE + 0.2)  # killed: its lease lapses, and b claims it
    assert await b.renew() and [c.dead_replica for c in await b.claim_dead()] == ["a"]
    await a.start()
    assert a.taken_over and await a.renew()
    await a.start()  # started again, not claimed since
    assert not a.taken_over


async def test_a_replica_closed_on_purpose_is_taken_over_at_once(pg: Callable[..., PostgresReplicas]) -> None:
    a, b = await pg("a"), await pg("b")
    await a.own("sbx_1")
    await a.close()
    claimed = await b.claim_dead()
    assert [(c.dead_replica, c.sandboxes) for c in claimed] == [("a", (("sbx_1", None),))]


async def test_a_take_over_says_whose_each_sandbox_is(pg: Callable[..., PostgresReplicas], database: str) -> None:
    """Kept with the owner row (owns at once go as one statement): a survivor that ends one no
    event records files that end under its tenant (service/takeover.py). A row from before it
    was kept (no organization) says nothing, and is taken over all the same."""
    a, b = await pg("a"), await pg("b")
    await asyncio.gather(a.own("sbx_1", Tenant("org_acme", "prj_1")), a.own("sbx_2", Tenant("org_rival")),
                         a.own("sbx_3"))
    conn = await asyncpg.connect(database)
    try:  # a row an older replica wrote
        await conn.execute("INSERT INTO hutch_sandbox_owners (sandbox_id, replica_id) VALUES ('sbx_old', 'a')")
    finally:
        await conn.close()
    await a.close()
    [claimed] = await b.claim_dead()
    assert {sid for sid, _ in claimed.sandboxes} == {"sbx_1", "sbx_2", "sbx_3", "sbx_old"}
    assert dict(claimed.tenants) == {"sbx_1": Tenant("org_acme", "prj_1"), "sbx_2": Tenant("org_rival")}


async def test_serialised_holds_off_the_other_replicas_on_that_key_only(pg: Callable[..., PostgresReplicas]) -> None:
    """An organization's quota check and create, across replicas (service/provisioning.py)."""
    a, b = await pg("a"), await pg("b")
    inside: list[str] = []
    a_in, a_out = asyncio.Event(), asyncio.Event()

    async def hold_a() -> None:
        async with a.serialised("quota:org_a"):
            inside.append("a")
            a_in.set()
            await a_out.wait()
            inside.remove("a")

    async def then_b() -> None:
        async with b.serialised("quota:org_a"):
            assert inside == [], inside  # never while a holds it
            inside.append("b")

    held = asyncio.create_task(hold_a())
    await a_in.wait()
    waiting = asyncio.create_task(then_b())
    async with asyncio.timeout(5), b.serialised("quota:org_b"):  # another key: not held off
        pass
    await asyncio.sleep(0.3)
    assert not waiting.done()  # b waits for a
    a_out.set()
    await asyncio.wait_for(asyncio.gather(held, waiting), 5)
    assert inside == ["b"]


async def test_a_replica_that_dies_holding_serialised_lets_the_others_in(pg: Callable[..., PostgresReplicas]) -> None:
    a, b = await pg("a"), await pg("b")
    entered = asyncio.Event()

    async def hold_for_ever() -> None:
        async with a.serialised("quota:org_a"):
            entered.set()
            await asyncio.sleep(3600)

    holder = asyncio.create_task(hold_for_ever())
    await entered.wait()
    async with a._locks.conn() as probe:  # the holder's session ends as a killed process's would
        ended = await probe.fetchval(  # this test's database only: other suites' locks stay
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
    assert ended == 1
    async with asyncio.timeout(10), b.serialised("quota:org_a"):
        pass
    holder.cancel()
    with pytest.raises((asyncio.CancelledError, Exception)):
        await holder


async def test_live_replicas_are_counted_until_they_close_or_lapse(pg: Callable[..., PostgresReplicas]) -> None:
    a, _b, c = await pg("a"), await pg("b"), await pg("c")  # b renews nothing: it lapses
    assert await a.live_count() == 3
    await c.close()  # stopped on purpose: its lease ends now
    assert await a.live_count() == 2
    await asyncio.sleep(LEASE + 0.3)  # b stops renewing
    assert await a.renew() is True
    assert await a.live_count() == 1


async def test_a_replica_that_stops_renewing_doubts_its_lease_before_the_store_does(
        database: str, started: list[Replicas]) -> None:
    """A stalled replica must not go on trusting what it owns: ``current`` turns False a margin
    before the database would let another replica claim it (api/replication.py then asks the
    store who owns a sandbox instead of serving it)."""
    lease = 2.0
    a = PostgresReplicas(database, me="a", url="http://a", lease_seconds=lease)
    await a.start()
    started.append(a)
    await a.own("sbx_stalled")
    assert a.current() and SoleReplica().current() and a.owns("sbx_stalled")
    await asyncio.sleep(lease * (1 - CURRENT_MARGIN) + 0.1)  # no renewal: a stall
    assert not a.current()
    # Not trusted without a round trip any more, but still remembered (to disown when it ends).
    assert not a.owns("sbx_stalled") and a.remembers("sbx_stalled") and not a.claimed
    found = await a.address("a")
    assert found is not None and found.alive  # the store still holds it: doubted first
    assert await a.renew() is True and a.current()


async def test_a_claimed_replica_is_not_current(pg: Callable[..., PostgresReplicas]) -> None:
    a, b = await pg("a"), await pg("b")
    await asyncio.sleep(LEASE + 0.2)
    assert await b.renew() is True
    assert [c.dead_replica for c in await b.claim_dead()] == ["a"]
    assert await a.renew() is False and not a.current() and a.claimed


def _registry_statements() -> int:
    return sum(value for name, labels, value in counters.counts()
               if name == "hutch_store_statements_total" and labels.get("store") == "replica registry")


async def test_owners_recorded_together_and_ended_ones_forgotten_lazily_share_statements(
        pg: Callable[..., PostgresReplicas]) -> None:
    """What a busy replica writes about its sandboxes' owners: owns asked at once go as one
    statement; a lazy disown (a sandbox ended) waits a moment for others and rides along."""
    a, b = await pg("a"), await pg("b")
    ids = [f"sbx_{i}" for i in range(5)]
    before = _registry_statements()
    await asyncio.gather(*(a.own(i) for i in ids))
    assert _registry_statements() - before == 1
    assert [await b.owner(i) for i in ids] == [Owner("a", "http://a", True)] * 5

    before = _registry_statements()
    await asyncio.gather(*(a.disown(i, lazily=True) for i in ids[:4]))
    assert _registry_statements() - before == 1
    # (the fixture's lease is shorter than the wait: who owns it is what counts here)
    assert [getattr(await b.owner(i), "replica_id", None) for i in ids] == [None] * 4 + ["a"]
    assert not a.remembers(ids[0]) and a.remembers(ids[4])

    pending = asyncio.create_task(a.disown(ids[4], lazily=True))  # waits for company ...
    await asyncio.sleep(0)
    await a.own("sbx_new")  # ... and goes with the next statement
    await pending
    assert await b.owner(ids[4]) is None and getattr(await b.owner("sbx_new"), "replica_id", None) == "a"
    await a.disown("sbx_new")  # at once: nothing waits
    assert await b.owner("sbx_new") is None
