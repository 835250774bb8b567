"""The client against the real broker: embedded, and over two gateways (members on one, publishers
on the other) where the test says `deployment`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from conftest import WAIT, Broker, Deployment, unique

import tinybroker
from tinybroker import (
    AckMode,
    Delivery,
    Message,
    Mode,
    Refused,
    SubscriptionOptions,
)
from tinybroker.aio import Client, Subscription

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 120))


async def within(aw: Coroutine[Any, Any, T], seconds: float = WAIT) -> T:
    return await asyncio.wait_for(aw, seconds)


async def delivery_of(sub: Subscription) -> Delivery:
    d = await within(sub.next_delivery())
    assert d is not None, "the stream ended"
    return d


# --- publish, subscribe, ack ------------------------------------------------------------------


def test_publish_subscribe_ack_in_order(deployment: Deployment) -> None:
    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        publishers = await Client.connect(deployment.publishers.url)
        sid, topic = unique("mail"), unique("jobs")
        sub = await members.subscribe(SubscriptionOptions.queue(sid, "mailers", [f"{topic}.>"]))
        member = await within(sub.active())
        assert member.member_id and member.epoch
        assert (sub.member_id, sub.epoch) == (member.member_id, member.epoch)
        first = await publishers.publish(Message(f"{topic}.email", "one", {"k": "v"}))
        batch = await publishers.publish_batch(
            [Message(f"{topic}.email", "two"), Message(f"{topic}.sms", b"three")]
        )
        publisher = await publishers.publisher()
        pending = [await publisher.send(Message(f"{topic}.x", str(n))) for n in range(20)]
        streamed = [await within(p) for p in pending]
        await publisher.close()
        sent = [first.system_id] + [p.system_id for p in batch + streamed]
        assert sent == sorted(sent), "ids rise in publish order"
        seen = []
        for _ in sent:
            d = await delivery_of(sub)
            assert d.attempt == 1 and d.member_id == member.member_id
            assert d.epoch == member.epoch and d.published_at is not None
            if d.system_id == first.system_id:
                assert (d.payload, d.headers) == (b"one", {"k": "v"})
            seen.append(d.system_id)
            d.ack()
        assert seen == sent
        await within(sub.close())
        info = await members.describe(sid)
        assert info.mode is Mode.QUEUE and info.in_flight == 0
        if deployment.name == "embedded":
            assert info.counters.acked == len(sent)
        await members.close()
        await publishers.close()

    run(body())


def test_nack_redelivers_with_the_next_attempt(deployment: Deployment) -> None:
    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        publishers = await Client.connect(deployment.publishers.url)
        sid, topic = unique("retry"), unique("jobs")
        sub = await members.subscribe(SubscriptionOptions.queue(sid, "w", [f"{topic}.*"]))
        await within(sub.active())
        sent = await publishers.publish(f"{topic}.a", "x")
        first = await delivery_of(sub)
        assert (first.system_id, first.attempt) == (sent.system_id, 1)
        first.nack()
        again = await delivery_of(sub)
        assert again.system_id == sent.system_id and again.attempt >= 2
        again.ack()
        with pytest.raises(tinybroker.InvalidArgumentError):
            again.ack()  # settled once only
        await within(sub.close())
        await members.close()
        await publishers.close()

    run(body())


def test_a_window_bounds_the_unacked_messages_a_member_holds(deployment: Deployment) -> None:
    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        publishers = await Client.connect(deployment.publishers.url)
        sid, topic = unique("window"), unique("jobs")
        opts = SubscriptionOptions.queue(sid, "w", [f"{topic}.*"]).with_(max_in_flight=3)
        sub = await members.subscribe(opts)
        await within(sub.active())
        ids = [(await publishers.publish(f"{topic}.a", str(n))).system_id for n in range(8)]
        held = [await delivery_of(sub) for _ in range(3)]
        assert [d.system_id for d in held] == ids[:3]
        info = await members.describe(sid)
        assert [m.in_flight for m in info.members] == [3]
        assert info.members[0].max_in_flight == 3
        # A full window: nothing more comes until an ack (a bounded look, not a wait for an event).
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(sub.next_delivery(), 0.3)
        held[0].ack()
        fourth = await delivery_of(sub)
        assert fourth.system_id == ids[3]  # the timed-out read lost nothing
        # Three acks ready together: one settle of at most the window's 3 ids.
        for d in [*held[1:], fourth]:
            d.ack()
        rest = [await delivery_of(sub) for _ in range(3)]
        assert [d.system_id for d in rest] == ids[4:7]
        for d in rest:
            d.ack()
        last = await delivery_of(sub)
        assert last.system_id == ids[7]
        last.ack()
        await within(sub.close())
        assert sub.refused_settlements == 0
        await members.close()
        await publishers.close()

    run(body())


def test_close_returns_once_every_ack_is_applied(deployment: Deployment) -> None:
    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        publishers = await Client.connect(deployment.publishers.url)
        sid, topic = unique("close"), unique("jobs")
        opts = SubscriptionOptions.queue(sid, "w", [f"{topic}.*"]).with_(max_in_flight=50)
        sub = await members.subscribe(opts)
        await within(sub.active())
        await publishers.publish_batch([Message(f"{topic}.a", str(n)) for n in range(50)])
        for _ in range(50):
            (await delivery_of(sub)).ack()
        # Nothing awaited between the last ack and close(): close must flush, half-close and
        # read to the end before it returns.
        await within(sub.close())
        info = await members.describe(sid)
        assert info.in_flight == 0 and info.queued_messages == 0, info
        if deployment.name == "embedded":
            assert info.counters.acked == 50
            assert info.counters.redelivered == 0
        await members.close()
        await publishers.close()

    run(body())


def test_close_releases_what_was_prefetched_with_the_same_attempt(deployment: Deployment) -> None:
    # docs/semantics.md#releases: what arrived within the window but was never handed out goes
    # back with the same attempt; what was handed out and left unsettled with attempt + 1.
    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        publishers = await Client.connect(deployment.publishers.url)
        sid, topic = unique("prefetch"), unique("jobs")
        opts = SubscriptionOptions.queue(sid, "w", [f"{topic}.*"]).with_(max_in_flight=4)
        sub = await members.subscribe(opts)
        await within(sub.active())
        ids = [
            (await publishers.publish(Message(f"{topic}.a", str(n)))).system_id for n in range(4)
        ]
        deadline = time.monotonic() + WAIT
        while (await members.describe(sid)).in_flight < 4:
            assert time.monotonic() < deadline, "the window never filled"
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)
        taken = await delivery_of(sub)
        assert taken.system_id == ids[0]
        # The successor is on the same gateway (cluster mode), so the local broker hands on
        # what was released without going back to JetStream.
        successor = await members.subscribe(opts)
        await within(successor.active())
        await within(sub.close())
        again = {}
        for _ in range(4):
            d = await delivery_of(successor)
            again[d.system_id] = d.attempt
            d.ack()
        assert again == {ids[0]: 2, ids[1]: 1, ids[2]: 1, ids[3]: 1}, again
        info = await members.describe(sid)
        assert (info.counters.released, info.counters.nacked) == (3, 0), info
        await within(successor.close())
        await members.close()
        await publishers.close()

    run(body())


# --- refusals as exceptions -------------------------------------------------------------------


def test_a_refused_settle_is_an_event_with_an_exception_and_close_raises_it(
    broker: Broker,
) -> None:
    async def body() -> None:
        client = await Client.connect(broker.url)
        sub = await client.subscribe(SubscriptionOptions.queue("twice", "w", ["t.*"]))
        member = await within(sub.active())
        await client.publish("t.a", "x")
        d = await delivery_of(sub)
        # Acked apart from the stream (fenced by member id), then again on the stream.
        await client.ack("twice", d.system_id, member.member_id)
        d.ack()
        await client.publish("t.a", "y")
        event = await within(sub.next_event())
        assert isinstance(event, Refused), event
        assert event.system_ids == (d.system_id,) and not event.nack
        assert isinstance(event.error, tinybroker.NotFoundError)
        assert not event.error.transient
        assert sub.refused_settlements == 1
        # The stream goes on; a refusal while closing is what close() raises.
        y = await delivery_of(sub)
        await client.ack("twice", y.system_id, member.member_id)
        y.ack()
        with pytest.raises(tinybroker.NotFoundError, match="not in flight"):
            await within(sub.close())
        await client.close()

    run(body())


def test_refusals_are_exceptions_that_say_whether_a_retry_helps(broker: Broker) -> None:
    async def body() -> None:
        client = await Client.connect(broker.url)
        with pytest.raises(tinybroker.InvalidArgumentError):
            await client.publish("no spaces", "x")
        with pytest.raises(tinybroker.NotFoundError):
            await client.describe("nobody")
        sub = await client.subscribe(SubscriptionOptions.queue("q", "g", ["q.*"]))
        with pytest.raises(tinybroker.FailedPreconditionError) as mismatch:
            await client.subscribe(SubscriptionOptions.queue("q", "other", ["q.*"]))
        assert isinstance(mismatch.value, tinybroker.RefusedError)
        assert not mismatch.value.transient
        b = await client.subscribe(SubscriptionOptions.broadcast("fan", "q.*"))
        with pytest.raises(tinybroker.AlreadyExistsError):
            await client.subscribe(SubscriptionOptions.broadcast("fan", "q.*"))
        with pytest.raises(tinybroker.InvalidArgumentError):
            await client.subscribe(SubscriptionOptions.queue("bad", "g", ["a b"]))
        with pytest.raises(tinybroker.InvalidArgumentError):
            await client.subscribe(
                SubscriptionOptions.queue("neg", "g", ["a"]).with_(max_in_flight=-1)
            )
        with pytest.raises(tinybroker.NotFoundError):
            await client.nack("q", 12345)
        # Bad input from the caller is a clear error, never a crash from deep inside.
        bad_calls = [
            client.ack("q", "12"),  # type: ignore[arg-type]
            client.ack("q", 2**64),
            client.nack("q", -1),
            client.describe(7),  # type: ignore[arg-type]
            client.publish("q.a", "x", {"k": 1}),  # type: ignore[dict-item]
            client.subscribe(SubscriptionOptions.queue("q", "g", "q.*").with_(ack_mode="x")),  # type: ignore[arg-type]
            client.subscribe(SubscriptionOptions.queue(3, "g", "q.*")),  # type: ignore[arg-type]
        ]
        for call in bad_calls:
            with pytest.raises(tinybroker.InvalidArgumentError):
                await call
        with pytest.raises(tinybroker.InvalidArgumentError):
            Message("q.a", "x", [("k", "v", "extra")])  # type: ignore[arg-type]
        # A stale ack: the message was redelivered to another member.
        leader_opts = SubscriptionOptions.singleton("stale", "g", ["s.*"])
        a = await client.subscribe(leader_opts)
        a_member = await within(a.active())
        standby = await client.subscribe(leader_opts)
        sent = await client.publish("s.x", "m")
        assert (await delivery_of(a)).system_id == sent.system_id
        a._cancel()
        await within(standby.active())
        redelivered = await delivery_of(standby)
        assert redelivered.attempt == 2
        with pytest.raises(tinybroker.FailedPreconditionError):
            await client.ack("stale", sent.system_id, a_member.member_id)
        redelivered.ack()
        await within(standby.close())
        await within(sub.close())
        await within(b.close())
        await client.close()

    run(body())


def test_connecting_to_nothing_or_a_bad_url_fails_clearly() -> None:
    async def body() -> None:
        from conftest import free_port

        started = time.monotonic()
        with pytest.raises(tinybroker.TransportError) as nothing:
            await Client.connect(f"http://127.0.0.1:{free_port()}")
        assert nothing.value.transient and time.monotonic() - started < 5
        for url in ["not a url", "ftp://x:1", "http://h:99999", "", "http://h:1/path"]:
            with pytest.raises(tinybroker.InvalidArgumentError):
                await Client.connect(url)
        with pytest.raises(tinybroker.InvalidArgumentError):
            await Client.connect("http://127.0.0.1:1", tinybroker.ClientOptions(token="bad\nline"))
        with pytest.raises(tinybroker.InvalidArgumentError):
            Message(b"topic", "x")  # type: ignore[arg-type]
        with pytest.raises(tinybroker.InvalidArgumentError):
            Message("t", 12)  # type: ignore[arg-type]

    run(body())


def test_a_bearer_token_is_sent_on_every_call() -> None:
    async def body() -> None:
        b = Broker(["--auth-token", "s3cret"])
        try:
            with pytest.raises(tinybroker.UnauthenticatedError):
                await (await Client.connect(b.url)).publish("a.b", "x")
            client = await Client.connect(b.url, tinybroker.ClientOptions(token="s3cret"))
            sub = await client.subscribe(SubscriptionOptions.queue("tok", "g", "a.*"))
            await within(sub.active())
            await client.publish("a.b", "x")
            (await delivery_of(sub)).ack()
            await within(sub.close())
            leader = await within(client.elect("tok-e", "g"))
            await within(leader.close())
            await client.close()
        finally:
            b.close()

    run(body())


def test_ack_free_deliveries_need_no_ack(broker: Broker) -> None:
    async def body() -> None:
        client = await Client.connect(broker.url)
        opts = SubscriptionOptions.broadcast("ticker", ["ticks.*"]).with_(ack_mode=AckMode.NONE)
        feed = await client.subscribe(opts)
        await within(feed.active())
        for n in range(5):
            await client.publish("ticks.a", str(n))
        for n in range(5):
            d = await delivery_of(feed)
            assert d.payload == str(n).encode()
            d.ack()  # nothing to do
        info = await client.describe("ticker")
        assert info.ack_mode is AckMode.NONE and info.in_flight == 0
        await within(feed.close())
        await client.close()

    run(body())


def test_describe_and_list(broker: Broker) -> None:
    async def body() -> None:
        client = await Client.connect(broker.url)
        opts = SubscriptionOptions.queue("d1", "g", ["d.*"]).with_(
            max_delivery_attempts=3, dead_letter_topic="dead.d1", max_in_flight=2
        )
        sub = await client.subscribe(opts)
        await within(sub.active())
        info = await client.describe("d1")
        assert info.patterns == ("d.*",) and info.consumer_group == "g"
        assert (info.max_delivery_attempts, info.dead_letter_topic) == (3, "dead.d1")
        assert info.expires_in is None and info.upstream is None
        assert len(info.members) == 1 and info.members[0].member_id == sub.member_id
        await within(sub.close())
        listing = await client.list()
        [d1] = [s for s in listing.subscriptions if s.subscription_id == "d1"]
        assert d1.expires_in is not None and d1.expires_in > 0
        assert listing.broker.subscriptions >= 1
        assert listing.broker.connections_open >= 1
        await client.close()

    run(body())


def test_delete_subscription_frees_its_id_for_new_settings(deployment: Deployment) -> None:
    """docs/semantics.md#deleting: refused while a member is joined (at the other gateway over
    two), then the idle subscription is deleted with its queued message counted, and its id
    takes other settings; unknown and malformed ids raise as every call's do."""

    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        elsewhere = await Client.connect(deployment.publishers.url)
        sid = unique("del")
        sub = await elsewhere.subscribe(SubscriptionOptions.queue(sid, "g", ["del.*"]))
        await within(sub.active())
        with pytest.raises(tinybroker.FailedPreconditionError, match="member"):
            await members.delete_subscription(sid)
        await within(sub.close())
        await elsewhere.publish("del.a", "kept, then discarded")

        async def counted() -> None:
            # Through gateways the backlog is the consumer's, whose leader may count a publish
            # a moment after its confirmation.
            while True:
                upstream = (await members.describe(sid)).upstream
                if upstream is None or upstream.pending + upstream.unacked == 1:
                    return

        await within(counted())

        async def deleted() -> int:
            while True:  # until the member's leave is seen everywhere
                try:
                    return await members.delete_subscription(sid)
                except tinybroker.FailedPreconditionError:
                    continue

        assert await within(deleted()) == 1
        listing = await members.list()
        assert (listing.broker.subscriptions_deleted, listing.broker.messages_deleted) == (1, 1)
        with pytest.raises(tinybroker.NotFoundError):
            await members.delete_subscription(sid)
        with pytest.raises(tinybroker.InvalidArgumentError):
            await members.delete_subscription("")
        leader = await members.subscribe(SubscriptionOptions.singleton(sid, "other", ["del.*"]))
        await within(leader.active())
        await elsewhere.publish("del.b", "new")
        d = await delivery_of(leader)
        assert (d.payload, d.attempt) == (b"new", 1)
        d.ack()
        await within(leader.close())
        await members.close()
        await elsewhere.close()

    run(body())


# --- the blocking API -------------------------------------------------------------------------


def test_the_blocking_api_runs_the_same_flow(broker: Broker) -> None:
    with tinybroker.Client(broker.url) as client:
        opts = SubscriptionOptions.queue("sync", "g", "s.*").with_(max_in_flight=4)
        with client.subscribe(opts) as sub:
            assert sub.active(timeout=WAIT).member_id == sub.member_id
            client.publish("s.a", "1")
            client.publish_batch([Message("s.b", "2"), Message("s.c", "3")])
            publisher = client.publisher()
            answers = [publisher.send(Message("s.d", str(n))) for n in range(4, 8)]
            assert all(f.result(WAIT).queued_for == 1 for f in answers)
            publisher.close()
            got = []
            for d in sub:
                got.append(d.payload)
                d.ack()
                if len(got) == 7:
                    break
            assert got == [str(n).encode() for n in range(1, 8)]
            with pytest.raises(TimeoutError):
                sub.next_delivery(timeout=0.2)
            client.publish("s.e", "8")
            d = sub.next_delivery(timeout=WAIT)  # the timed-out read lost nothing
            assert d is not None and d.payload == b"8"
            d.ack()
        info = client.describe("sync")
        assert info.counters.acked == 8 and info.in_flight == 0
        with pytest.raises(tinybroker.NotFoundError):
            client.delete_subscription("nobody")
        with pytest.raises(tinybroker.NotFoundError):
            client.describe("nobody")


def test_interrupt_stops_the_iteration_and_close_applies_the_acks(broker: Broker) -> None:
    with tinybroker.Client(broker.url) as client:
        sub = client.subscribe(SubscriptionOptions.queue("intr", "g", "i.*"))
        sub.active(timeout=WAIT)
        client.publish("i.a", "1")
        seen = []
        for d in sub:
            seen.append(d.system_id)
            d.ack()
            sub.interrupt()  # from a signal handler or another thread alike
        assert len(seen) == 1
        sub.close(timeout=WAIT)
        assert client.describe("intr").counters.acked == 1
