"""The README's quick start, run as written: two replicas of the election block (one killed with
SIGKILL), the worker block, and the watch block following a leader."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from conftest import WAIT, Broker, Process

import tinybroker

README = Path(__file__).resolve().parents[1] / "README.md"


def block(name: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    [code] = [b for b in blocks if b.startswith(f"# quickstart: {name}\n")]
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
