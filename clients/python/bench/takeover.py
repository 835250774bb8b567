#!/usr/bin/env python3
"""Takeover time after `kill -9` of a Python leader: two `examples/scheduler.py` replicas on one
broker; the leader is SIGKILLed, and the time until the standby prints `leading` is measured
(by this process, reading the standby's output). A new standby is started before each kill.

    python3 clients/python/bench/takeover.py [--tries 10] [--binary PATH] [--server URL]
"""

from __future__ import annotations

import argparse
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCHEDULER = Path(__file__).resolve().parents[1] / "examples" / "scheduler.py"


class Replica:
    def __init__(self, server: str, group: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-u", str(SCHEDULER), "--server", server, "--group", group],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def wait_for(self, prefix: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.001, deadline - time.monotonic()))
            if line.startswith(prefix):
                return line

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--binary", type=Path, default=REPO / "target" / "release" / "tinybroker")
    parser.add_argument("--server", help="a running broker; default: start one")
    args = parser.parse_args()
    broker = None
    server = args.server
    if server is None:
        broker = subprocess.Popen(
            [str(args.binary), "serve", "--listen", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert broker.stderr is not None
        for line in broker.stderr:
            match = re.search(r"listening on (\S+)", line)
            if match:
                server = f"http://{match.group(1)}"
                break
        assert server is not None, "the broker did not start"
        threading.Thread(target=lambda: broker.stderr.read(), daemon=True).start()  # type: ignore[union-attr]
    group = f"takeover-{int(time.time())}"
    leader = Replica(server, group)
    epoch = int(leader.wait_for("leading epoch=").split()[1][6:])
    takeovers = []
    try:
        for _ in range(args.tries):
            standby = Replica(server, group)
            standby.wait_for("standby position=1")
            killed = time.monotonic()
            leader.kill()
            line = standby.wait_for("leading epoch=")
            takeovers.append((time.monotonic() - killed) * 1000)
            next_epoch = int(line.split()[1][6:])
            assert next_epoch > epoch, (next_epoch, epoch)
            leader, epoch = standby, next_epoch
    finally:
        leader.kill()
        if broker is not None:
            broker.kill()
            broker.wait()
    print("takeover after kill -9, ms:", " ".join(f"{t:.1f}" for t in takeovers))
    print(f"median {statistics.median(takeovers):.1f} ms, max {max(takeovers):.1f} ms")


if __name__ == "__main__":
    main()
