"""Watching a SINGLETON subscription's leadership (docs/semantics.md#watching-leadership) against
the real broker: embedded, and over two gateways with the members on one and the watcher on
the other where the test says `deployment`, so the watcher sees what the coordination bucket
records, not what its own gateway holds."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Optional

import pytest
from conftest import WAIT, Broker, Deployment, unique
from test_client import run, within

import tinybroker
from tinybroker import LeaderState, SubscriptionOptions
from tinybroker.aio import Client, LeadershipWatch


class Frames:
    """A watch's states as read, each checked: epochs never fall, every member named is one the
    test made (`members`), and `since` is a plausible time by this machine's clock."""

    def __init__(self, watch: LeadershipWatch, members: set[int]) -> None:
        self.watch = watch
        self.members = members
        self.read: list[LeaderState] = []

    async def next(self) -> LeaderState:
        state = await within(self.watch.next())
        self.check(state)
        return state

    def check(self, state: LeaderState) -> None:
        if self.read:
            assert state.epoch >= self.read[-1].epoch, f"epoch fell: {state} after {self.read}"
        assert state.active_member_id is None or state.active_member_id in self.members, (
            f"{state} names a member not in {self.members}"
        )
        now = datetime.now(timezone.utc)
        assert now - timedelta(seconds=120) < state.since < now + timedelta(seconds=5), state
        self.read.append(state)

    async def until(self, active: Optional[int], epoch: int) -> LeaderState:
        """Reads until a state names `active` (None: no member) with `epoch`."""

        async def reach() -> LeaderState:
            while True:
                state = await self.watch.next()
                self.check(state)
                if (state.active_member_id, state.epoch) == (active, epoch):
                    return state

        try:
            return await within(reach())
        except asyncio.TimeoutError:
            raise AssertionError(
                f"no state ({active}, {epoch}) within {WAIT} s; read {self.read}"
            ) from None


def singleton(sid: str) -> SubscriptionOptions:
    return SubscriptionOptions.singleton(sid, "g", [f"{sid}.x"])


async def watch_ends(watch: LeadershipWatch) -> tinybroker.TinybrokerError:
    """Reads the watch to its end; the error that ended it."""

    async def end() -> tinybroker.TinybrokerError:
        while True:
            try:
                await watch.next()
            except tinybroker.TinybrokerError as error:
                return error

    return await within(end())


def test_a_watcher_sees_a_promotion_with_a_higher_epoch(deployment: Deployment) -> None:
    """The active member leaves; the standby made active is the watcher's next state, with a
    higher epoch; standbys joining send nothing; with no member left the last epoch stays."""

    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        watcher = await Client.connect(deployment.publishers.url)
        sid = unique("promote")
        a = await members.subscribe(singleton(sid))
        ca = await within(a.active())
        watch = await within(watcher.watch_leadership(sid))
        assert watch.subscription_id == sid
        frames = Frames(watch, {ca.member_id})
        if deployment.name == "embedded":
            first = await frames.next()
            assert (first.active_member_id, first.epoch) == (ca.member_id, ca.epoch), first
        else:
            # The watcher's gateway learns of the line from its copy of the bucket.
            await frames.until(ca.member_id, ca.epoch)
        b = await members.subscribe(singleton(sid))
        # A standby joined: no change, no state (a bounded look, not a wait for an event). The
        # read it cancels is kept for the next one.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(watch.next(), 0.3)
        await within(a.close())
        cb = await within(b.active())
        frames.members.add(cb.member_id)
        assert cb.epoch > ca.epoch
        if deployment.name == "embedded":
            promoted = await frames.next()
            assert (promoted.active_member_id, promoted.epoch) == (cb.member_id, cb.epoch)
        else:
            promoted = await frames.until(cb.member_id, cb.epoch)
        assert promoted.since >= frames.read[0].since
        await within(b.close())
        await frames.until(None, cb.epoch)
        await within(watch.close())
        await members.close()
        await watcher.close()

    run(body())


def test_the_first_state_is_the_current_one(deployment: Deployment) -> None:
    """A watch opened now starts with the state the server knows now, `since` included: the
    active member, then, once it left, none with its epoch."""

    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        watcher = await Client.connect(deployment.publishers.url)
        sid = unique("first")
        a = await members.subscribe(singleton(sid))
        ca = await within(a.active())
        follower = await within(watcher.watch_leadership(sid))
        frames = Frames(follower, {ca.member_id})
        reached = await frames.until(ca.member_id, ca.epoch)
        if deployment.name == "embedded":
            assert frames.read == [reached], "the first state is the current one"
        async with await within(watcher.watch_leadership(sid)) as late:
            assert await within(late.next()) == reached
        await within(a.close())
        gone = await frames.until(None, ca.epoch)
        async with await within(watcher.watch_leadership(sid)) as later:
            assert await within(later.next()) == gone
        await within(follower.close())
        await members.close()
        await watcher.close()

    run(body())


def test_watching_refuses_unknown_ids_other_modes_and_bad_ids(deployment: Deployment) -> None:
    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        watcher = await Client.connect(deployment.publishers.url)
        with pytest.raises(tinybroker.NotFoundError):
            await within(watcher.watch_leadership(unique("nobody")))
        qid, bid = unique("queue"), unique("fan")
        queue = await members.subscribe(SubscriptionOptions.queue(qid, "g", [f"{qid}.*"]))
        await within(queue.active())
        with pytest.raises(tinybroker.FailedPreconditionError) as refused:
            await within(watcher.watch_leadership(qid))
        assert not refused.value.transient
        fan = await members.subscribe(SubscriptionOptions.broadcast(bid, f"{bid}.*"))
        await within(fan.active())
        with pytest.raises(tinybroker.FailedPreconditionError):
            await within(members.watch_leadership(bid))
        with pytest.raises(tinybroker.InvalidArgumentError):
            await within(watcher.watch_leadership(""))
        with pytest.raises(tinybroker.InvalidArgumentError):
            await within(watcher.watch_leadership(7))  # type: ignore[arg-type]
        await within(queue.close())
        await within(fan.close())
        await members.close()
        await watcher.close()

    run(body())


def test_deleting_the_subscription_ends_the_watch_with_not_found(deployment: Deployment) -> None:
    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        watcher = await Client.connect(deployment.publishers.url)
        sid = unique("gone")
        a = await members.subscribe(singleton(sid))
        ca = await within(a.active())
        watch = await within(watcher.watch_leadership(sid))
        frames = Frames(watch, {ca.member_id})
        await frames.until(ca.member_id, ca.epoch)
        await within(a.close())
        await frames.until(None, ca.epoch)

        async def deleted() -> int:
            while True:  # until the member's leave is seen everywhere
                try:
                    return await members.delete_subscription(sid)
                except tinybroker.FailedPreconditionError:
                    continue

        await within(deleted())
        end = await watch_ends(watch)
        assert isinstance(end, tinybroker.NotFoundError), repr(end)
        assert "expired or was deleted" in end.message, end
        # Every later read says the same, and iterating raises it.
        with pytest.raises(tinybroker.NotFoundError):
            await watch.next()
        with pytest.raises(tinybroker.NotFoundError):
            async for _ in watch:
                pass
        await within(watch.close())
        await members.close()
        await watcher.close()

    run(body())


def test_expiry_ends_the_watch_with_not_found() -> None:
    async def body() -> None:
        b = Broker(["--idle-timeout", "300ms"])
        try:
            client = await Client.connect(b.url)
            a = await client.subscribe(singleton("brief"))
            ca = await within(a.active())
            watch = await within(client.watch_leadership("brief"))
            frames = Frames(watch, {ca.member_id})
            await frames.until(ca.member_id, ca.epoch)
            await within(a.close())
            await frames.until(None, ca.epoch)
            end = await watch_ends(watch)
            assert isinstance(end, tinybroker.NotFoundError), repr(end)
            with pytest.raises(tinybroker.NotFoundError):
                await client.describe("brief")
            await client.close()
        finally:
            b.close()

    run(body())


def test_a_shutdown_ends_the_watch_with_unavailable() -> None:
    async def body() -> None:
        b = Broker([])
        try:
            client = await Client.connect(b.url)
            leader = await within(client.elect("bye", "g"))
            watch = await within(client.watch_leadership("bye"))
            await Frames(watch, {leader.member_id}).until(leader.member_id, leader.epoch)
            assert b.stop() == 0  # SIGTERM: a watch does not hold the shutdown up
            end = await watch_ends(watch)
            assert isinstance(end, tinybroker.UnavailableError) and end.transient, repr(end)
            await client.close()
        finally:
            b.close()

    run(body())


def test_close_and_garbage_cancel_the_call(broker: Broker) -> None:
    async def body() -> None:
        client = await Client.connect(broker.url)
        leader = await within(client.elect("closing", "g"))
        watch = await within(client.watch_leadership("closing"))
        assert (await within(watch.next())).active_member_id == leader.member_id
        waiting = asyncio.ensure_future(watch.next())
        done, _ = await asyncio.wait({waiting}, timeout=0.05)
        assert not done, "no change, no state"
        await within(watch.close())
        assert watch.closed and watch._call.cancelled()
        with pytest.raises(tinybroker.UnavailableError, match="closed"):
            await asyncio.wait_for(waiting, WAIT)
        with pytest.raises(tinybroker.UnavailableError):
            await watch.next()
        assert [s async for s in watch] == [], "iterating a closed watch stops"
        await within(watch.close())  # twice is fine

        # Dropped with a read pending (cancelled by a timeout): garbage, it cancels its call.
        dropped = await within(client.watch_leadership("closing"))
        await within(dropped.next())
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(dropped.next(), 0.05)
        call = dropped._call
        del dropped
        gc.collect()
        assert call.cancelled(), "a watch that is garbage cancels its call"

        # An `async for` ends when the watch is closed from its body.
        async with await within(client.watch_leadership("closing")) as looped:
            seen = [state async for state in _closing_after_one(looped)]
        assert [s.active_member_id for s in seen] == [leader.member_id]
        await within(leader.close())
        await client.close()

    run(body())


async def _closing_after_one(watch: LeadershipWatch) -> AsyncIterator[LeaderState]:
    async for state in watch:
        yield state
        await watch.close()


def test_the_blocking_watch_follows_a_promotion(broker: Broker) -> None:
    with tinybroker.Client(broker.url) as client:
        with pytest.raises(tinybroker.NotFoundError):
            client.watch_leadership("nobody", timeout=WAIT)
        leader = client.elect("sync-watch", "g", timeout=WAIT)
        with client.watch_leadership("sync-watch", timeout=WAIT) as watch:
            first = watch.next(timeout=WAIT)
            assert (first.active_member_id, first.epoch) == (leader.member_id, leader.epoch)
            standby = client.subscribe(SubscriptionOptions.election("sync-watch", "g"))
            with pytest.raises(TimeoutError):
                watch.next(timeout=0.2)  # a standby joined: nothing to say
            leader.close(timeout=WAIT)
            promoted = standby.active(timeout=WAIT)
            state = watch.next(timeout=WAIT)  # the timed-out read lost nothing
            assert (state.active_member_id, state.epoch) == (promoted.member_id, promoted.epoch)
            assert state.epoch > leader.epoch
            standby.close(timeout=WAIT)
            seen = []
            for state in watch:
                seen.append(state)
                watch.close()  # from the loop body: the iteration stops
            assert [(s.active_member_id, s.epoch) for s in seen] == [(None, promoted.epoch)]
            assert watch.closed
