"""The README's quick start, run as written: two replicas of the election block (one killed with
SIGKILL), the worker block, the watch block following a leader, both ways to stop a leader on
SIGTERM, and the CLI member that joins a Python election's line."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import WAIT, Broker, Process, binary

import tinybroker

README = Path(__file__).resolve().parents[1] / "README.md"


def block(name: str) -> str:
    """The README's Python block whose first line is `# quickstart: NAME` or `# recipe: NAME`."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    [code] = [b for b in blocks if b.split("\n", 1)[0].split(": ", 1)[-1] == name]
    return code


def test_the_quick_start_election_fails_over_on_kill_9(
    broker: Broker, processes: list[Process], tmp_path: Path
) -> None:
    script = tmp_path / "election.py"
    script.write_text(block("election"))
    env = {"TINYBROKER_SERVER": broker.url, "REPORT_STORE": str(tmp_path / "report.log")}
    first = Process([sys.executable, str(script)], "first", env)
    processes.append(first)
    epoch = int(first.wait_for(r"leading epoch=(\d+)").group(1))
    second = Process([sys.executable, str(script)], "second", env)
    processes.append(second)
    with tinybroker.Client(broker.url) as client:
        deadline = time.monotonic() + WAIT
        while len(client.describe("nightly-report").members) < 2:
            assert time.monotonic() < deadline, "the second replica never joined"
            time.sleep(0.01)  # polling interval of the check
    first.kill()
    next_epoch = int(second.wait_for(r"leading epoch=(\d+)", timeout=10).group(1))
    assert next_epoch > epoch
    # The store takes the new leader's writes.
    store = tmp_path / "report.log"
    deadline = time.monotonic() + WAIT
    while f"{next_epoch} report done" not in (store.read_text() if store.exists() else ""):
        assert time.monotonic() < deadline, "the new leader never wrote the store"
        time.sleep(0.01)  # polling interval of the check


def test_the_quick_start_worker_runs(broker: Broker, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(block("worker"))
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "TINYBROKER_SERVER": broker.url},
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"^member \d+$", done.stdout, flags=re.M), done.stdout
    assert "jobs.email b'hello' 1" in done.stdout, done.stdout


def test_the_quick_start_watch_follows_the_leader_until_the_subscription_is_gone(
    broker: Broker, tmp_path: Path
) -> None:
    script = tmp_path / "watch.py"
    script.write_text(block("watch"))
    with tinybroker.Client(broker.url) as client:
        leader = client.elect("nightly-report", "reporters", timeout=WAIT)
        watcher = Process([sys.executable, str(script)], "watch", {"TINYBROKER_SERVER": broker.url})
        try:
            watcher.wait_for(rf"^leader={leader.member_id} epoch={leader.epoch}$")
            standby = client.subscribe(
                tinybroker.SubscriptionOptions.election("nightly-report", "reporters")
            )
            leader.close(timeout=WAIT)
            promoted = standby.active(timeout=WAIT)
            assert promoted.epoch > leader.epoch
            watcher.wait_for(rf"^leader={promoted.member_id} epoch={promoted.epoch}$")
            standby.close(timeout=WAIT)
            watcher.wait_for(rf"^leader=None epoch={promoted.epoch}$")
            assert client.delete_subscription("nightly-report", timeout=WAIT) == 0
            watcher.wait_for(r"^nightly-report is gone$")
            assert watcher.process.wait(WAIT) == 0
        finally:
            watcher.close()


@pytest.mark.parametrize("name", ["stop on SIGTERM", "stop on SIGTERM, asyncio"])
def test_a_leader_stopped_by_sigterm_steps_down_at_once(
    broker: Broker, processes: list[Process], tmp_path: Path, name: str
) -> None:
    """Each recipe for SIGTERM, run as written: the leader steps down at once, the standby
    leads within milliseconds (bounded here at 2 s, measured), and the leader exits 0."""
    script = tmp_path / "leader.py"
    script.write_text(block(name))
    env = {"TINYBROKER_SERVER": broker.url}
    first = Process([sys.executable, str(script)], "first", env)
    processes.append(first)
    epoch = int(first.wait_for(r"^leading epoch=(\d+)$").group(1))
    second = Process([sys.executable, str(script)], "second", env)
    processes.append(second)
    with tinybroker.Client(broker.url) as client:
        deadline = time.monotonic() + WAIT
        while len(client.describe("nightly-report").members) < 2:
            assert time.monotonic() < deadline, "the second replica never joined"
            time.sleep(0.01)  # polling interval of the check
    sent = time.monotonic()
    first.process.send_signal(signal.SIGTERM)
    next_epoch = int(second.wait_for(r"^leading epoch=(\d+)$", timeout=10).group(1))
    took = time.monotonic() - sent
    print(f"{name}: the standby led {took * 1000:.1f} ms after the SIGTERM")
    assert next_epoch > epoch
    assert took < 2, f"the standby led {took:.2f} s after the SIGTERM"
    assert first.process.wait(10) == 0, first.errors.seen[-5:]
    first.wait_for(r"^stopped$")
    # The other stops the same way while it leads, and one waiting in line leaves the line.
    third = Process([sys.executable, str(script)], "third", env)
    processes.append(third)
    with tinybroker.Client(broker.url) as client:
        deadline = time.monotonic() + WAIT
        while len(client.describe("nightly-report").members) < 2:
            assert time.monotonic() < deadline, "the third replica never joined"
            time.sleep(0.01)  # polling interval of the check
        third.process.send_signal(signal.SIGTERM)
        assert third.process.wait(10) == 0, third.errors.seen[-5:]
        second.process.send_signal(signal.SIGTERM)
        assert second.process.wait(10) == 0, second.errors.seen[-5:]
        deadline = time.monotonic() + WAIT
        while client.describe("nightly-report").members:
            assert time.monotonic() < deadline, "a stopped replica is still in line"
            time.sleep(0.01)  # polling interval of the check


def test_the_readmes_cli_member_joins_the_python_election(
    broker: Broker, processes: list[Process]
) -> None:
    """The README's `tinybroker subscribe` line for the election: it joins the same line as
    `elect` (behind the Python leader), and leads once the leader steps down."""
    lines = re.findall(r"^tinybroker subscribe (.*)$", README.read_text(), flags=re.M)
    [args] = [a for a in lines if "election.nightly-report" in a]
    with tinybroker.Client(broker.url) as client:
        leader = client.elect("nightly-report", "reporters", timeout=WAIT)
        cli = Process(
            [str(binary()), "subscribe", "--server", broker.url, *shlex.split(args)], "cli"
        )
        processes.append(cli)
        cli.wait_for(r"^joined subscription=nightly-report")
        deadline = time.monotonic() + WAIT
        while len(client.describe("nightly-report").members) < 2:
            assert time.monotonic() < deadline, "the CLI member never joined the line"
            time.sleep(0.01)  # polling interval of the check
        leader.close(timeout=WAIT)
        epoch = int(cli.wait_for(r"^confirmed subscription=nightly-report .* epoch=(\d+)").group(1))
        assert epoch > leader.epoch
