"""Leaving a leadership, stopping a leader on a signal, the options `leaderships()` takes, and
a leadership watch that rejoins after a broker restart or NOT_FOUND."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from conftest import WAIT, Broker, Process, python_example, unique
from test_client import run, within

import tinybroker
from tinybroker import LostCause, SubscriptionOptions
from tinybroker.aio import Client

# --- leaving `with leadership:` ----------------------------------------------------------------


def test_leaving_a_leadership_lost_to_an_outage_is_quiet_and_the_loop_goes_on() -> None:
    """The rejoin loop a user writes: `with leadership:` around the job, left once `wait_lost`
    reported the outage. Leaving is quiet (the cause is on the `Lost`), and the next `elect`
    leads once the broker is back. An explicit `close()` still says the acks may be lost."""
    b = Broker([])
    try:
        with tinybroker.Client(b.url) as client:
            epochs = []
            for _ in range(2):
                leader = client.elect("quiet", "g", timeout=WAIT)
                epochs.append(leader.epoch)
                with leader:
                    assert b.stop() == 0  # SIGTERM: every stream ends with UNAVAILABLE
                    lost = leader.wait_lost(WAIT)
                    assert lost is not None and lost.cause is LostCause.ENDED, lost
                    assert isinstance(lost.error, tinybroker.UnavailableError), lost
                assert leader.is_lost
                with pytest.raises(tinybroker.UnavailableError):
                    leader.close(timeout=WAIT)
                b.start()
            assert epochs[1] > epochs[0]

        async def body() -> None:
            client = await Client.connect(b.url)
            leader = await within(client.elect("quiet-aio", "g"))
            async with leader:
                assert b.stop() == 0
                lost = await within(leader.lost())
                assert lost.cause is LostCause.ENDED, lost
            b.start()
            again = await within(client.elect("quiet-aio", "g"))
            assert again.epoch > leader.epoch
            async with again:
                pass  # leading: leaving closes it
            assert (await within(again.lost())).cause is LostCause.RESIGNED
            await client.close()

        run(body())
    finally:
        b.close()


def test_an_exception_inside_with_leadership_resigns_at_once(broker: Broker) -> None:
    for leadership in (tinybroker.Leadership, tinybroker.aio.Leadership):
        doc = leadership.__doc__ or ""
        assert "exception" in doc and "resign" in doc, f"{leadership} does not say so: {doc}"
    with tinybroker.Client(broker.url) as client:
        leader = client.elect("raises", "g", timeout=WAIT)
        standby = client.subscribe(SubscriptionOptions.election("raises", "g"))
        with pytest.raises(RuntimeError, match="the job failed"), leader:
            raise RuntimeError("the job failed")
        lost = leader.wait_lost(0)
        assert lost is not None and lost.cause is LostCause.RESIGNED, lost
        promoted = standby.active(timeout=WAIT)
        assert promoted.epoch > leader.epoch
        standby.close(timeout=WAIT)


# --- stopping on SIGTERM -----------------------------------------------------------------------


def sigterm_takeover(leader: Process, standby: Process, leading: str) -> float:
    """SIGTERM to `leader`; the seconds until `standby` prints a line matching `leading`.
    Asserts the leader exits 0 promptly."""
    sent = time.monotonic()
    leader.process.send_signal(signal.SIGTERM)
    standby.wait_for(leading, timeout=10)
    took = time.monotonic() - sent
    code = leader.process.wait(10)
    assert code == 0, f"exit {code}: {leader.lines.seen[-5:]} {leader.errors.seen[-5:]}"
    return took


def test_sigterm_of_the_scheduler_example_steps_down_at_once(
    broker: Broker, processes: list[Process], tmp_path: Path
) -> None:
    group = unique("term")
    flags = ["--server", broker.url, "--group", group, "--every-ms", "50"]
    flags += ["--store", str(tmp_path / "store.log")]
    first = python_example("scheduler.py", *flags, tag="first")
    processes.append(first)
    epoch = int(first.wait_for(r"leading epoch=(\d+)").group(1))
    first.wait_for(rf"epoch={epoch} run=2")
    second = python_example("scheduler.py", *flags, tag="second")
    processes.append(second)
    second.wait_for(r"standby position=1")
    took = sigterm_takeover(first, second, r"leading epoch=\d+")
    print(f"takeover after SIGTERM of the scheduler example: {took * 1000:.1f} ms")
    assert took < 2, f"the standby led {took:.2f} s after the SIGTERM"
    first.wait_for(r"^stopped")
    # A standby stopped while it waits in line leaves the line and exits 0 as well.
    third = python_example("scheduler.py", *flags, tag="third")
    processes.append(third)
    third.wait_for(r"standby position=1")
    third.process.send_signal(signal.SIGTERM)
    assert third.process.wait(10) == 0, third.errors.seen[-5:]
    with tinybroker.Client(broker.url) as client:
        deadline = time.monotonic() + WAIT
        while len(client.describe("scheduler").members) > 1:
            assert time.monotonic() < deadline, "the stopped standby is still in line"
            time.sleep(0.01)  # polling interval of the check


# --- the options leaderships() takes -----------------------------------------------------------


def test_leaderships_and_elect_take_metadata_and_priority(broker: Broker) -> None:
    with tinybroker.Client(broker.url) as client:
        for leader in client.leaderships("opts", "g", metadata="10.0.0.7:8080", priority=3):
            info = client.describe("opts")
            assert info.active_member_id == leader.member_id
            assert info.active_metadata == "10.0.0.7:8080", info
            assert [m.priority for m in info.members] == [3], info
            break
        leader = client.elect("opts", "g", metadata="10.0.0.8:8080", timeout=WAIT)
        assert client.describe("opts").active_metadata == "10.0.0.8:8080"
        leader.close(timeout=WAIT)

    async def body() -> None:
        client = await Client.connect(broker.url)
        async for leader in client.leaderships("opts-aio", "g", metadata="a:1", priority=2):
            info = await client.describe("opts-aio")
            assert info.active_member_id == leader.member_id
            assert (info.active_metadata, [m.priority for m in info.members]) == ("a:1", [2])
            break
        options = SubscriptionOptions.election("opts-aio", "g").with_(metadata="b:2")
        async for leader in client.leaderships_with(options):
            assert (await client.describe("opts-aio")).active_metadata == "b:2"
            assert not leader.is_lost
            break
        await client.close()

    run(body())


# --- a watch that rejoins ----------------------------------------------------------------------


def test_a_rejoining_watch_outlives_a_broker_restart_and_not_found() -> None:
    async def body() -> None:
        b = Broker([])
        try:
            client = await Client.connect(b.url)
            # Opened before anyone joined: it waits for the subscription instead of raising.
            opening = asyncio.ensure_future(client.watch_leadership("rw", rejoin=True))
            done, _ = await asyncio.wait({opening}, timeout=0.3)
            assert not done, "a rejoining watch waits for the subscription to exist"
            first = await within(client.elect("rw", "g"))
            watch = await within(opening)
            state = await within(watch.next())
            assert (state.active_member_id, state.epoch) == (first.member_id, first.epoch)

            async def until(member: Optional[int], epoch: int) -> None:
                while True:
                    state = await watch.next()
                    if (state.active_member_id, state.epoch) == (member, epoch):
                        return

            # A broker restart: the watch goes on, and sees the next leader.
            b.kill()
            assert (await within(first.lost())).cause is LostCause.ENDED
            b.start()
            second = await within(client.elect("rw", "g"))
            assert second.epoch > first.epoch
            await within(until(second.member_id, second.epoch))

            # NOT_FOUND: the subscription is deleted; the watch waits for the next one.
            await within(second.close())
            assert await within(client.delete_subscription("rw")) == 0
            third = await within(client.elect("rw", "g"))
            await within(until(third.member_id, third.epoch))
            assert third.epoch > second.epoch

            # Closed while it waits for a subscription again: the read ends at once.
            await within(third.close())
            await within(until(None, third.epoch))
            assert await within(client.delete_subscription("rw")) == 0
            reading = asyncio.ensure_future(watch.next())
            done, _ = await asyncio.wait({reading}, timeout=0.3)
            assert not done, "no subscription, nothing to say"
            await within(watch.close())
            with pytest.raises(tinybroker.UnavailableError, match="closed"):
                await within(reading)
            assert [s async for s in watch] == []
            # Refusals a retry would repeat are still raised.
            queue = await client.subscribe(SubscriptionOptions.queue("rw-q", "g", ["rw.q"]))
            with pytest.raises(tinybroker.FailedPreconditionError):
                await within(client.watch_leadership("rw-q", rejoin=True))
            await within(queue.close())
            await client.close()
        finally:
            b.close()

    run(body())


def test_the_blocking_watch_rejoins_too() -> None:
    b = Broker([])
    try:
        with tinybroker.Client(b.url) as client:
            leader = client.elect("rw-sync", "g", timeout=WAIT)
            with client.watch_leadership("rw-sync", rejoin=True, timeout=WAIT) as watch:
                assert watch.next(timeout=WAIT).epoch == leader.epoch
                b.kill()
                assert leader.wait_lost(WAIT) is not None
                b.start()
                again = client.elect("rw-sync", "g", timeout=WAIT)
                deadline = time.monotonic() + WAIT
                while watch.next(timeout=WAIT).active_member_id != again.member_id:
                    assert time.monotonic() < deadline, "the watch never saw the new leader"
                again.close(timeout=WAIT)
    finally:
        b.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
