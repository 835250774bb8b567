"""Leader election: the lost signal, takeover after kill -9, broker restarts, and one line shared
by Python and Rust replicas."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import pytest
from conftest import (
    WAIT,
    Broker,
    Deployment,
    Process,
    python_example,
    rust_example,
    unique,
)
from test_client import run, within

import tinybroker
from tinybroker import AckMode, LostCause, Mode
from tinybroker.aio import Client


def test_elect_joins_with_the_rust_clients_settings(broker: Broker) -> None:
    async def body() -> None:
        client = await Client.connect(broker.url)
        positions: list[int] = []
        leader = await within(client.elect("cron", "replicas"))
        standby = asyncio.ensure_future(client.elect("cron", "replicas", positions.append))
        while len((await client.describe("cron")).members) < 2:
            await asyncio.sleep(0.01)  # polling interval of the check
        info = await client.describe("cron")
        assert info.mode is Mode.SINGLETON and info.patterns == ("election.cron",)
        assert info.consumer_group == "replicas" and info.ack_mode is AckMode.EXPLICIT
        assert (info.max_delivery_attempts, info.dead_letter_topic) == (0, None)
        assert [m.max_in_flight for m in info.members] == [1, 1]
        assert info.active_member_id == leader.member_id
        assert positions == [1] and not standby.done()
        # Resigning: the lost signal says so, and the standby leads with a higher epoch.
        lost_task = asyncio.ensure_future(leader.lost())
        leader.resign()
        lost = await within(lost_task)
        assert (
            lost.cause is LostCause.RESIGNED and lost.error is None and lost.epoch == leader.epoch
        )
        second = await within(standby)
        assert second.epoch > leader.epoch
        # close() steps down once its acks are applied; lost says RESIGNED as well.
        await within(second.close())
        assert (await within(second.lost())).cause is LostCause.RESIGNED
        await client.close()

    run(body())


def test_the_lost_signal_tells_an_outage_from_a_resignation() -> None:
    async def body() -> None:
        b = Broker([])
        client = await Client.connect(b.url)
        leader = await within(client.elect("outage", "g"))
        seen: list[tinybroker.Lost] = []
        leader.on_lost(seen.append)
        assert b.stop() == 0  # SIGTERM: the broker ends every stream with UNAVAILABLE
        lost = await within(leader.lost())
        assert lost.cause is LostCause.ENDED and lost.epoch == leader.epoch
        assert isinstance(lost.error, tinybroker.UnavailableError) and lost.error.transient
        assert seen == [lost] and leader.is_lost
        with pytest.raises(tinybroker.UnavailableError):
            await leader.close()  # its acks may not have been applied: it says so
        await client.close()

    run(body())


def test_elect_waits_out_a_broker_outage_and_rejoins() -> None:
    async def body() -> None:
        b = Broker([])
        client = await Client.connect(b.url)
        first = await within(client.elect("rejoin", "g"))
        b.kill()
        assert (await within(first.lost())).cause is LostCause.ENDED
        # Electing while the broker is down waits (rejoining with backoff) instead of failing.
        again = asyncio.ensure_future(client.elect("rejoin", "g"))
        done, _ = await asyncio.wait({again}, timeout=0.3)
        assert not done
        b.start()
        second = await within(again)
        assert second.epoch > first.epoch, "epochs rise across broker restarts"
        await within(second.close())
        await client.close()
        b.close()

    run(body())


def test_the_blocking_leaderships_loop_re_elects_after_each_loss(broker: Broker) -> None:
    with tinybroker.Client(broker.url) as client:
        epochs = []
        for leader in client.leaderships("loop", "g"):
            assert leader.wait_lost(timeout=0.01) is None
            epochs.append(leader.epoch)
            if len(epochs) == 3:
                break
            leader.resign()
            lost = leader.wait_lost(WAIT)
            assert lost is not None and lost.resigned
        assert epochs == sorted(set(epochs)) and len(epochs) == 3
        assert client.describe("loop").members == ()


# --- processes: the examples ------------------------------------------------------------------


def scheduler(broker: Broker, store: Path, group: str, tag: str) -> Process:
    return python_example(
        "scheduler.py",
        "--server",
        broker.url,
        "--group",
        group,
        "--every-ms",
        "50",
        "--store",
        str(store),
        tag=tag,
    )


def store_epochs(store: Path) -> list[int]:
    return [int(line.split()[0][6:]) for line in store.read_text().splitlines()]


def test_kill_9_of_a_python_leader_promotes_the_python_standby(
    deployment: Deployment, processes: list[Process], tmp_path: Path
) -> None:
    # Three tries: each time the leader is SIGKILLed, the standby (on the other gateway, over
    # two gateways) leads with a higher epoch and the fenced store takes its writes.
    store, group = tmp_path / "report.log", unique("replicas")
    brokers = [deployment.members, deployment.publishers]
    leader = scheduler(brokers[0], store, group, "r0")
    processes.append(leader)
    epoch = int(leader.wait_for(r"leading epoch=(\d+)").group(1))
    leader.wait_for(rf"epoch={epoch} run=2")
    takeovers = []
    for n in range(1, 4):
        standby = scheduler(brokers[n % 2], store, group, f"r{n}")
        processes.append(standby)
        standby.wait_for(r"standby position=1")
        killed = time.monotonic()
        leader.kill()
        next_epoch = int(standby.wait_for(r"leading epoch=(\d+)", timeout=10).group(1))
        takeovers.append(time.monotonic() - killed)
        assert next_epoch > epoch
        standby.wait_for(rf"epoch={next_epoch} run=2")
        leader, epoch = standby, next_epoch
    seen = store_epochs(store)
    assert seen == sorted(seen) and seen[-1] == epoch
    print(f"takeover after kill -9 ({deployment.name}): {[round(t * 1000) for t in takeovers]} ms")
    assert statistics.median(takeovers) < 5


def test_a_broker_restart_gives_each_new_leader_a_higher_epoch(
    processes: list[Process], tmp_path: Path
) -> None:
    b = Broker([])
    try:
        store = tmp_path / "restart.log"
        replicas = [scheduler(b, store, "restarts", f"r{i}") for i in range(2)]
        processes.extend(replicas)
        epochs: list[int] = []

        def next_leader() -> tuple[Process, int]:
            # Whichever replica leads first after the (re)start.
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline:
                for r in replicas:
                    try:
                        line = r.lines.next(timeout=0.05)
                    except Exception:
                        continue
                    if line and line.startswith("leading epoch="):
                        return r, int(line.split()[1][6:])
            raise AssertionError("no replica led after the restart")

        leader, epoch = next_leader()
        epochs.append(epoch)
        leader.wait_for(rf"epoch={epoch} run=2")
        for _ in range(2):
            b.kill()
            b.start()
            leader, epoch = next_leader()
            assert epoch > epochs[-1]
            epochs.append(epoch)
            leader.wait_for(rf"epoch={epoch} run=2")
        seen = store_epochs(store)
        assert seen == sorted(seen)
        assert sorted(set(seen)) == epochs, "one leader per broker run, in order"
    finally:
        b.close()


def test_python_and_rust_replicas_share_one_line_and_one_store(
    broker: Broker, processes: list[Process], tmp_path: Path
) -> None:
    store, group = tmp_path / "mixed.log", unique("mixed")
    flags = ["--server", broker.url, "--group", group, "--every-ms", "50", "--store", str(store)]
    rust = Process([str(rust_example("scheduler")), *flags], "rust")
    processes.append(rust)
    rust_epoch = int(rust.wait_for(r"leading epoch=(\d+)").group(1))
    rust.wait_for(rf"epoch={rust_epoch} run=2")
    python = scheduler(broker, store, group, "python")
    processes.append(python)
    python.wait_for(r"standby position=1")  # one line: the Python replica waits behind Rust
    rust.kill()
    python_epoch = int(python.wait_for(r"leading epoch=(\d+)", timeout=10).group(1))
    assert python_epoch > rust_epoch
    python.wait_for(rf"epoch={python_epoch} run=2")
    # And back: a Rust standby behind the Python leader takes over from it.
    rust2 = Process([str(rust_example("scheduler")), *flags], "rust2")
    processes.append(rust2)
    rust2.wait_for(r"standby position=1")
    python.kill()
    last = int(rust2.wait_for(r"leading epoch=(\d+)", timeout=10).group(1))
    assert last > python_epoch
    rust2.wait_for(rf"epoch={last} run=2")
    seen = store_epochs(store)
    assert seen == sorted(seen) and set(seen) == {rust_epoch, python_epoch, last}


@pytest.mark.parametrize(
    "content",
    [b"garbage\n", b"\xff\xfe\n", b"epoch=abc run=1\n", b"1796151620428999 1\n", b"epoch=9 run=1"],
)
def test_the_python_scheduler_store_fails_closed(
    broker: Broker, processes: list[Process], tmp_path: Path, content: bytes
) -> None:
    store = tmp_path / "bad.log"
    store.write_bytes(content)
    replica = scheduler(broker, store, unique("bad"), "bad")
    processes.append(replica)
    epoch = replica.wait_for(r"leading epoch=(\d+)").group(1)
    line = replica.wait_for(rf"^(failed )?epoch={epoch} run=1\b.*").group(0)
    assert line.startswith("failed") and "cannot parse" in line, line
    assert store.read_bytes() == content, "nothing is written past what cannot be parsed"


def test_the_python_scheduler_is_refused_by_a_higher_epoch_beside_a_stray_byte(
    broker: Broker, processes: list[Process], tmp_path: Path
) -> None:
    store = tmp_path / "higher.log"
    content = b"epoch=9000000000000000 run=1\n\xff\n"
    store.write_bytes(content)
    replica = scheduler(broker, store, unique("higher"), "higher")
    processes.append(replica)
    epoch = int(replica.wait_for(r"leading epoch=(\d+)").group(1))
    assert epoch < 9_000_000_000_000_000
    replica.wait_for(rf"^refused epoch={epoch} run=1: fenced")
    assert store.read_bytes() == content
