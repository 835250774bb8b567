"""Member metadata and `proclaim` (docs/semantics.md#member-metadata) against the real broker:
embedded, and over two gateways with the members on one and the watcher, the describe and
some proclamations on the other, so the answers come from the coordination bucket."""

from __future__ import annotations

from typing import Callable

import pytest
from conftest import WAIT, Broker, Deployment, unique
from test_client import run, within

import tinybroker
from tinybroker import LeaderState, SubscriptionInfo, SubscriptionOptions
from tinybroker.aio import Client, LeadershipWatch


async def state_where(watch: LeadershipWatch, done: Callable[[LeaderState], bool]) -> LeaderState:
    async def reach() -> LeaderState:
        while True:
            state = await watch.next()
            if done(state):
                return state

    return await within(reach())


async def described(
    client: Client, sid: str, done: Callable[[SubscriptionInfo], bool]
) -> SubscriptionInfo:
    """`describe` until `done` holds of it (a gateway's copy of the bucket catches up)."""

    async def reach() -> SubscriptionInfo:
        while True:
            info = await client.describe(sid)
            if done(info):
                return info

    return await within(reach())


def test_the_leaders_metadata_is_watched_described_and_proclaimed(deployment: Deployment) -> None:
    """A leader joins with metadata; the watcher and `describe` show it; what it proclaims
    replaces it with the same epoch; a standby's proclamation is refused; on promotion the
    standby's own metadata is shown."""

    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        other = await Client.connect(deployment.publishers.url)
        sid = unique("meta")
        options = SubscriptionOptions.election(sid, "g")
        leader = await within(members.elect_with(options.with_(metadata="a:1")))
        watch = await within(other.watch_leadership(sid))
        first = await state_where(watch, lambda s: s.active_member_id == leader.member_id)
        assert (first.epoch, first.metadata) == (leader.epoch, "a:1"), first

        await within(leader.proclaim("a:2 ✓"))
        said = await state_where(watch, lambda s: s.metadata == "a:2 ✓")
        assert (said.active_member_id, said.epoch) == (leader.member_id, leader.epoch)
        info = await described(other, sid, lambda i: i.active_metadata == "a:2 ✓")
        assert info.active_member_id == leader.member_id

        standby = await members.subscribe(options.with_(metadata="b:1"))
        mine = await within(members.describe(sid))
        while len(mine.members) < 2:
            mine = await within(members.describe(sid))
        assert [m.metadata for m in mine.members] == ["a:2 ✓", "b:1"], mine
        b = mine.members[1].member_id
        for at in (members, other):
            with pytest.raises(tinybroker.FailedPreconditionError, match="on standby"):
                await within(at.proclaim(sid, b, leader.epoch, "b:2"))
            with pytest.raises(tinybroker.InvalidArgumentError, match="over the limit of 1024"):
                await within(at.proclaim(sid, leader.member_id, leader.epoch, "x" * 1025))
            with pytest.raises(tinybroker.InvalidArgumentError, match="metadata is a str"):
                await within(at.proclaim(sid, leader.member_id, leader.epoch, 7))  # type: ignore[arg-type]
        assert (await within(other.describe(sid))).active_metadata == "a:2 ✓"

        await within(leader.close())
        promoted = await within(standby.active())
        state = await state_where(watch, lambda s: s.active_member_id == promoted.member_id)
        assert (state.epoch, state.metadata) == (promoted.epoch, "b:1"), state
        # Its member is gone: nothing to proclaim for.
        with pytest.raises(tinybroker.NotFoundError):
            await within(leader.proclaim("too late"))
        await within(other.proclaim(sid, promoted.member_id, promoted.epoch, "b:2"))
        await state_where(watch, lambda s: s.metadata == "b:2")
        await within(standby.close())
        await within(watch.close())
        await members.close()
        await other.close()

    run(body())


def test_metadata_out_of_bounds_is_refused_at_the_join(deployment: Deployment) -> None:
    async def body() -> None:
        client = await Client.connect(deployment.members.url)
        sid = unique("big")
        with pytest.raises(tinybroker.InvalidArgumentError, match="1026 bytes"):
            await within(
                client.subscribe(SubscriptionOptions.election(sid, "g").with_(metadata="é" * 513))
            )
        queue = SubscriptionOptions.queue(unique("work"), "g", ["work.*"]).with_(metadata="q")
        with pytest.raises(tinybroker.InvalidArgumentError, match="DELIVERY_MODE_SINGLETON"):
            await within(client.subscribe(queue))
        with pytest.raises(tinybroker.InvalidArgumentError, match="metadata is a str"):
            await within(
                client.subscribe(SubscriptionOptions.election(sid, "g").with_(metadata=b"x"))  # type: ignore[arg-type]
            )
        await client.close()

    run(body())


def test_the_blocking_leadership_proclaims(broker: Broker) -> None:
    with tinybroker.Client(broker.url) as client:
        options = SubscriptionOptions.election("blocking", "g").with_(metadata="before")
        leader = client.elect_with(options, timeout=WAIT)
        assert client.describe("blocking").active_metadata == "before"
        leader.proclaim("after", timeout=WAIT)
        assert client.describe("blocking").members[0].metadata == "after"
        with pytest.raises(tinybroker.FailedPreconditionError):
            client.proclaim("blocking", leader.member_id, leader.epoch + 1, "x", timeout=WAIT)
        with client.watch_leadership("blocking", timeout=WAIT) as watch:
            assert watch.next(WAIT).metadata == "after"
        leader.close()
