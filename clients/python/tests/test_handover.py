"""Priority and hand-over (docs/semantics.md#priority, docs/semantics.md#hand-over) against the
real broker: an active SINGLETON member steps down only at a message boundary, when
`hand_over` asks it to or a member of higher priority joins; it is sent nothing more, and once
it acked what it holds it is told (`SteppedDown`; a `Leadership` is lost with HANDED_OVER and
leaves the line) and the first standby is promoted with a higher epoch. Nothing is delivered
twice. The same through gateways (docs/semantics.md#cluster-priority-and-hand-over), where a
gateway's describe shows its own members and counters."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest
from conftest import WAIT, Broker, Deployment, unique
from test_client import run, within

import tinybroker
from tinybroker import (
    Active,
    Delivery,
    HandedOver,
    LostCause,
    Message,
    SteppedDown,
    SubscriptionInfo,
    SubscriptionOptions,
)
from tinybroker.aio import Client, Leadership


async def message_of(leader: Leadership) -> Delivery:
    delivery = await within(leader.next_message())
    assert delivery is not None, "leadership lost before a message came"
    return delivery


async def members_until(
    client: Client, sid: str, done: Callable[[SubscriptionInfo], bool]
) -> SubscriptionInfo:
    """`describe` until `done` holds, polling every 10 ms (the broker applies a leave or a join
    after the call that caused it returns)."""

    async def reach() -> SubscriptionInfo:
        while True:
            info = await client.describe(sid)
            if done(info):
                return info
            await asyncio.sleep(0.01)  # polling interval of the check

    return await within(reach())


async def in_line(client: Client, sid: str, count: int) -> SubscriptionInfo:
    return await members_until(client, sid, lambda i: len(i.members) == count)


async def stepping_down(client: Client, sid: str, member_id: int) -> None:
    await members_until(client, sid, lambda i: i.stepping_down_member_id == member_id)


def test_a_handed_over_leader_acks_its_message_then_the_standby_leads(
    deployment: Deployment,
) -> None:
    """`hand_over` waits for the leader's message in flight; meanwhile the leader gets nothing
    new. Its ack completes it: the leader's `lost()` says HANDED_OVER and it leaves the line,
    the standby leads with a higher epoch and gets the next message as a first delivery, and
    `hand_over` answers with both members and epochs."""

    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        other = await Client.connect(deployment.publishers.url)
        sid = unique("ho")
        topic = f"election.{sid}"
        first = await within(members.elect(sid, "g"))
        standby = asyncio.ensure_future(members.elect(sid, "g"))
        await in_line(members, sid, 2)
        await other.publish(topic, "m1")
        m1 = await message_of(first)
        request = asyncio.ensure_future(other.hand_over(sid))
        await stepping_down(members, sid, first.member_id)
        await other.publish(topic, "m2")
        assert not request.done(), "answered before the message was acked"
        assert not first.is_lost and first.buffered_messages == 0
        m1.ack()
        lost = await within(first.lost())
        assert (lost.cause, lost.epoch, lost.error) == (
            LostCause.HANDED_OVER,
            first.epoch,
            None,
        )
        assert lost.handed_over and not lost.resigned and "handed over" in str(lost)
        done = await within(request)
        second = await within(standby)
        assert second.epoch > first.epoch
        assert done == HandedOver(first.member_id, first.epoch, second.member_id, second.epoch)
        m2 = await message_of(second)
        assert (m2.payload, m2.attempt, m2.epoch) == (b"m2", 1, second.epoch)
        m2.ack()
        # The leader that handed over left the line: its Leadership is over. (Described at
        # the members' gateway: a gateway shows its own members and counters.)
        info = await in_line(members, sid, 1)
        assert info.members[0].member_id == second.member_id
        assert info.stepping_down_member_id is None
        c = info.counters
        assert (c.redelivered, c.handovers, c.handovers_overdue, c.promotions) == (0, 1, 0, 1)
        assert await within(first.next_message()) is None
        await within(first.close())  # nothing left to flush: it returns
        await within(second.close())
        after = await within(members.describe(sid))
        if after.upstream is None:
            assert after.counters.redelivered == 0 and after.counters.acked == 2
        else:  # a gateway forgot its counters with its last member: JetStream's say it
            assert (after.upstream.redelivered, after.upstream.unacked) == (0, 0)
        await members.close()
        await other.close()

    run(body())


def test_a_higher_priority_elect_takes_over_from_a_lower_one(deployment: Deployment) -> None:
    """A replica electing with a higher priority takes over once the leader acked what it
    holds; the leader of lower priority loses with HANDED_OVER, also when the replica of
    higher priority is at another gateway."""

    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        other = await Client.connect(deployment.publishers.url)
        sid = unique("prio")
        topic = f"election.{sid}"
        low = await within(members.elect(sid, "g"))
        await other.publish(topic, "m1")
        m1 = await message_of(low)
        high = asyncio.ensure_future(other.elect(sid, "g", priority=5))
        await stepping_down(members, sid, low.member_id)
        await other.publish(topic, "m2")
        assert not high.done() and not low.is_lost
        m1.ack()
        assert (await within(low.lost())).cause is LostCause.HANDED_OVER
        leader = await within(high)
        assert leader.epoch > low.epoch
        m2 = await message_of(leader)
        assert (m2.payload, m2.attempt) == (b"m2", 1)
        m2.ack()
        info = await in_line(other, sid, 1)
        assert [(m.member_id, m.priority, m.active) for m in info.members] == [
            (leader.member_id, 5, True)
        ]
        assert info.counters.redelivered == 0
        if deployment.name != "gateways":  # counted at the gateway that held the leader
            assert info.counters.handovers == 1
        # The replica of lower priority elects again: it waits behind the leader of higher
        # priority and leads once that one resigns.
        again = asyncio.ensure_future(other.elect(sid, "g"))
        await in_line(other, sid, 2)
        assert not again.done()
        leader.resign()
        low2 = await within(again)
        assert low2.epoch > leader.epoch
        await within(low2.close())
        await members.close()
        await other.close()

    run(body())


def test_a_subscription_that_steps_down_stays_in_line_blocking(broker: Broker) -> None:
    """A member joined by hand is told `SteppedDown` (not `Standby`) with the epoch that
    ended, stays in line, and is confirmed again with a new epoch; describe shows each
    member's priority. On the blocking API."""
    with tinybroker.Client(broker.url) as client:
        sid = unique("raw")
        options = SubscriptionOptions.singleton(sid, "g", [f"{sid}.>"]).with_(notify_standby=True)
        first = client.subscribe(options.with_(priority=2), timeout=WAIT)
        a = first.active(WAIT)
        second = client.subscribe(options.with_(priority=2), timeout=WAIT)
        standby = second.next_event(WAIT)
        assert isinstance(standby, tinybroker.Standby) and standby.position == 1
        quiet = client.subscribe(options.with_(notify_standby=False), timeout=WAIT)
        info = client.describe(sid, timeout=WAIT)
        while len(info.members) < 3:
            info = client.describe(sid, timeout=WAIT)
        assert [(m.priority, m.position) for m in info.members] == [(2, 0), (2, 1), (0, 2)]
        # Nothing in flight: it hands over at once.
        done = client.hand_over(sid, timeout=WAIT)
        event = first.next_event(WAIT)
        assert isinstance(event, SteppedDown), event
        assert not isinstance(event, tinybroker.Standby)
        # Behind the member that took over, ahead of the one of lower priority.
        assert event == SteppedDown(a.member_id, a.epoch, 1)
        assert not first.is_active
        b = second.active(WAIT)
        assert done == HandedOver(a.member_id, a.epoch, b.member_id, b.epoch)
        assert b.epoch > a.epoch
        info = client.describe(sid, timeout=WAIT)
        line = [(m.member_id, m.priority, m.position) for m in info.members]
        assert line[:2] == [(b.member_id, 2, 0), (a.member_id, 2, 1)], line
        assert line[2][1:] == (0, 2), line
        assert info.counters.handovers == 1
        second.close(WAIT)
        again = first.next_event(WAIT)
        while isinstance(again, tinybroker.Standby):  # a new place in line, if told
            again = first.next_event(WAIT)
        assert isinstance(again, Active) and again.epoch > b.epoch
        assert (first.epoch, first.is_active) == (again.epoch, True)
        first.close(WAIT)
        quiet.close(WAIT)


def test_a_blocking_leaderships_loop_is_handed_over_and_elects_again(broker: Broker) -> None:
    with tinybroker.Client(broker.url) as client, tinybroker.Client(broker.url) as other:
        sid = unique("loop")
        replica = client.leaderships(sid, "g")
        first = next(replica)
        high = other.elect(sid, "g", priority=1, timeout=WAIT)
        lost = first.wait_lost(WAIT)
        assert lost is not None and lost.cause is LostCause.HANDED_OVER
        assert lost.epoch == first.epoch < high.epoch
        # It left the line (the broker applies the leave a moment after the client sent it).
        members = other.describe(sid).members
        while len(members) > 1:
            members = other.describe(sid).members
        assert [m.member_id for m in members] == [high.member_id]
        high.close()
        second = next(replica)
        assert second.epoch > high.epoch
        second.close()
        replica.close()


def test_an_overdue_hand_over_gives_what_is_held_to_the_successor() -> None:
    """Past the broker's --handover-timeout, what the leader still holds goes to its successor
    as on a failover (attempt 2), and the leader is lost with HANDED_OVER all the same."""

    async def body() -> None:
        b = Broker(["--handover-timeout", "300ms"])
        try:
            client = await Client.connect(b.url)
            sid = unique("late")
            first = await within(client.elect(sid, "g"))
            standby = asyncio.ensure_future(client.elect(sid, "g"))
            await in_line(client, sid, 2)
            sent = await client.publish(f"election.{sid}", "m1")
            held = await message_of(first)
            done = await within(client.hand_over(sid))
            assert (await within(first.lost())).cause is LostCause.HANDED_OVER
            second = await within(standby)
            assert (done.member_id, done.epoch) == (second.member_id, second.epoch)
            again = await message_of(second)
            assert (again.system_id, again.attempt) == (sent.system_id, 2)
            with pytest.raises(tinybroker.UnavailableError):
                held.ack()  # the member's stream is gone: its successor has the message
            again.ack()
            await within(second.close())
            c = (await within(client.describe(sid))).counters
            assert (c.handovers, c.handovers_overdue, c.acked) == (1, 1, 1)
            await client.close()
        finally:
            b.close()

    run(body())


def test_hand_overs_and_priorities_that_cannot_be_are_refused(deployment: Deployment) -> None:
    """Refusals name the reason and change nothing; a bad priority is refused before it is
    sent, and `elect` raises it instead of retrying."""

    async def body() -> None:
        client = await Client.connect(deployment.members.url)
        with pytest.raises(tinybroker.NotFoundError):
            await within(client.hand_over("nobody"))
        with pytest.raises(tinybroker.InvalidArgumentError, match="subscription_id is required"):
            await within(client.hand_over(""))
        with pytest.raises(tinybroker.InvalidArgumentError, match="bad request"):
            await within(client.hand_over(7))  # type: ignore[arg-type]

        sid = unique("alone")
        alone = await within(client.elect(sid, "g"))
        queue_id = unique("q")
        queue = await client.subscribe(SubscriptionOptions.queue(queue_id, "g", [f"{queue_id}.>"]))
        await within(queue.active())
        with pytest.raises(tinybroker.FailedPreconditionError, match="no standby"):
            await within(client.hand_over(sid))
        with pytest.raises(tinybroker.FailedPreconditionError, match="only a SINGLETON"):
            await within(client.hand_over(queue_id))

        with pytest.raises(
            tinybroker.InvalidArgumentError,
            match="priority only applies to DELIVERY_MODE_SINGLETON",
        ):
            await within(
                client.subscribe(
                    SubscriptionOptions.queue(unique("q2"), "g", ["q.>"]).with_(priority=1)
                )
            )
        bad: list[Any] = [-1, 2**32, "1", 1.5]
        for priority in bad:
            with pytest.raises(tinybroker.InvalidArgumentError, match=r"priority is an int"):
                await within(client.elect(sid, "g", priority=priority))
            options = SubscriptionOptions.election(sid, "g").with_(priority=priority)
            with pytest.raises(tinybroker.InvalidArgumentError, match=r"priority is an int"):
                await within(client.subscribe(options))

        # A leader of higher priority than every standby would take over again at once.
        ranked_id = unique("ranked")
        ranked = await within(client.elect(ranked_id, "g", priority=3))
        low = asyncio.ensure_future(client.elect(ranked_id, "g"))
        await in_line(client, ranked_id, 2)
        with pytest.raises(tinybroker.FailedPreconditionError, match="above every standby"):
            await within(client.hand_over(ranked_id))
        assert not ranked.is_lost and not low.done()
        await within(ranked.close())
        await within((await within(low)).close())

        # Still the leader, with its epoch.
        info = await within(client.describe(sid))
        assert (info.active_member_id, info.epoch) == (alone.member_id, alone.epoch)
        assert not alone.is_lost
        await within(alone.close())
        await within(queue.close())
        await client.close()

    run(body())


def test_a_publish_fenced_by_a_handed_over_epoch_is_refused(broker: Broker) -> None:
    """The epoch that ended with a hand-over fences like any other: the former leader's
    fenced publish is refused, naming the epoch now."""

    async def body() -> None:
        client = await Client.connect(broker.url)
        sid = unique("fence")
        first = await within(client.elect(sid, "g"))
        standby = asyncio.ensure_future(client.elect(sid, "g"))
        await in_line(client, sid, 2)
        done = await within(client.hand_over(sid))
        assert (await within(first.lost())).cause is LostCause.HANDED_OVER
        second = await within(standby)
        assert done.epoch == second.epoch
        with pytest.raises(tinybroker.FailedPreconditionError, match=str(second.epoch)):
            await within(first.publish(Message(f"out.{sid}", "late")))
        await within(second.publish(Message(f"out.{sid}", "now")))
        await within(second.close())
        await client.close()

    run(body())
