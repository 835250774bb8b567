"""Fenced publishes (docs/semantics.md#fenced-publish) against the real broker: a leader's
`Leadership.publish` is stored; once it is deposed, a publish fenced by its epoch is refused
naming the new one, and the new leader's fenced batch is stored, on both deployments
(docs/semantics.md#cluster-fenced-publish)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import Deployment, unique
from test_client import run, within

import tinybroker
from tinybroker import Message, SubscriptionOptions
from tinybroker.aio import Client


def test_a_deposed_leaders_fenced_publish_is_refused(deployment: Deployment) -> None:
    async def body() -> None:
        members = await Client.connect(deployment.members.url)
        publishers = await Client.connect(deployment.publishers.url)
        sid, topic = unique("cron"), unique("runs")
        worker = await within(
            members.subscribe(SubscriptionOptions.broadcast(unique("workers"), f"{topic}.*"))
        )
        await within(worker.active())
        first = await within(members.elect(sid, "g"))
        standby = members.elect(sid, "g")
        await within(first.publish(Message(f"{topic}.job", "first-1")))
        deposed = first.epoch
        second_task = asyncio.ensure_future(standby)
        await within(first.close())
        second = await within(second_task)
        assert second.epoch > deposed

        late = Message(f"{topic}.job", "late").fenced(sid, deposed)
        with pytest.raises(tinybroker.FailedPreconditionError) as refused:
            await within(publishers.publish(late))
        assert f"the active epoch is {second.epoch}" in refused.value.message
        batch = [second.fence(Message(f"{topic}.job", p)) for p in ("second-1", "second-2")]
        await within(publishers.publish_batch(batch))

        seen = []
        while len(seen) < 3:
            delivery = await within(worker.next_delivery())
            assert delivery is not None
            seen.append(delivery.payload.decode())
            delivery.ack()
        assert seen == ["first-1", "second-1", "second-2"]
        await within(second.close())

    run(body())


def test_a_fence_is_validated_before_it_is_sent() -> None:
    with pytest.raises(tinybroker.InvalidArgumentError):
        Message("a.b", "x", fence=("sub", "1"))  # type: ignore[arg-type]
    fenced = Message("a.b", "x").header("k", "v").fenced("sub", 3)
    assert fenced.fence == ("sub", 3) and fenced.header("k2", "v").fence == ("sub", 3)
