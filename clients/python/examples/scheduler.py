#!/usr/bin/env python3
"""A scheduled job that runs on exactly one of N replicas: the Python twin of the Rust
`examples/scheduler.rs`, on the blocking API (a scheduled job is usually plain blocking code).

Start a broker (`tinybroker serve`), then this in two or more terminals:

    python3 scheduler.py --group reporters --every-ms 1000 --store /tmp/report.log
    python3 scheduler.py --server http://127.0.0.1:50051 --group reporters --store /tmp/report.log

One replica prints `leading epoch=E member=M` and then `epoch=E run=K` every interval; the others
print `standby position=P`. Stop the leader with `kill PID` (SIGTERM) or Ctrl-C: it resigns at
once, prints `stopped` and exits 0, and the next in line prints `leading` with a higher epoch
within milliseconds (a standby stopped so leaves the line). Even after SIGKILL the next in line
leads at once: the broker sees the connection close. Rust replicas (`cargo run --example
scheduler -- --group reporters --store /tmp/report.log`) join the same line: both elect on the
subscription `scheduler` (the topic `election.scheduler`) with the same settings, and both
write the same store format, `epoch=E run=K` lines, fenced by the epoch. A store this replica
cannot parse fails closed: nothing is written to it (only a store that does not exist yet
counts as empty).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from typing import Optional

import tinybroker

USAGE = """usage: scheduler.py [--server URL] [--group NAME] [--every-ms N] [--store PATH]
                    [--token TOKEN]

  --server URL    broker URL (default http://127.0.0.1:50051, env TINYBROKER_SERVER)
  --group NAME    consumer group of the replicas (default scheduler); the election's
                  subscription id is `scheduler`, on the topic election.scheduler
  --every-ms N    run the job every N ms while leading (default 1000)
  --store PATH    append `epoch=E run=K` to PATH, fenced by the epoch (optional)
  --token TOKEN   bearer token (env TINYBROKER_AUTH_TOKEN)
"""

#: One store line: exactly what `fenced_append` writes (and the Rust example writes).
LINE = re.compile(rb"epoch=([0-9]{1,20}) run=([0-9]{1,20})")
U64 = 2**64 - 1


class Fenced(Exception):
    """A later leader wrote already: this one is deposed."""


class StoreFailed(Exception):
    """The store could not be read, parsed or written: nothing is known about leadership, so
    nothing is written and the job is tried again at the next tick."""


def read_store(data: bytes) -> tuple[int, Optional[str]]:
    """The highest epoch among the store's whole `epoch=E run=K` lines, and what is wrong with
    the first thing that is not one (None when every line is)."""
    if not data:
        return 0, None
    problem = None
    if not data.endswith(b"\n"):
        problem = "cannot parse the store: its last line is not complete"
    else:
        data = data[:-1]
    highest = 0
    for number, line in enumerate(data.split(b"\n"), start=1):
        match = LINE.fullmatch(line)
        if match is None or int(match.group(1)) > U64 or int(match.group(2)) > U64:
            if problem is None:
                problem = (
                    f"cannot parse the store at line {number}: {line[:60]!r} is not `epoch=E run=K`"
                )
            continue
        highest = max(highest, int(match.group(1)))
    return highest, problem


def fenced_append(store: str, epoch: int, run: int) -> None:
    """The job's side effect, fenced by epoch: refuses to write if the store has a higher one.
    (A real store checks atomically, e.g. a conditional write `WHERE epoch <= :epoch`; one
    process per epoch writes here, so read-then-append does.)"""
    try:
        with open(store, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        data = b""
    except OSError as error:
        raise StoreFailed(f"cannot read the store: {error}") from None
    highest, problem = read_store(data)
    if highest > epoch:
        raise Fenced(f"fenced: the store has epoch {highest}, this leader has {epoch}")
    if problem is not None:
        # Fails closed: a line it cannot parse might hold a higher epoch.
        raise StoreFailed(problem)
    line = f"epoch={epoch} run={run}\n".encode()
    try:
        fd = os.open(store, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # One write: a replica killed mid-run leaves a whole line or none.
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as error:
        raise StoreFailed(f"cannot write the store: {error}") from None


def parse(argv: list[str]) -> dict[str, Optional[str]]:
    args: dict[str, Optional[str]] = {
        "server": os.environ.get("TINYBROKER_SERVER", "http://127.0.0.1:50051"),
        "group": "scheduler",
        "every-ms": "1000",
        "store": None,
        "token": os.environ.get("TINYBROKER_AUTH_TOKEN"),
    }
    it = iter(argv)
    for flag in it:
        if flag in ("-h", "--help"):
            print(USAGE, end="")
            raise SystemExit(0)
        name = flag[2:] if flag.startswith("--") else ""
        if name not in args:
            raise ValueError(f"unknown flag {flag!r} (see --help)")
        value = next(it, None)
        if value is None:
            raise ValueError(f"{flag} needs a value")
        args[name] = value
    every = args["every-ms"] or ""
    if not every.isdigit() or int(every) <= 0:
        raise ValueError(f"--every-ms {every!r} is not a positive number")
    return args


def lead(leader: tinybroker.Leadership, store: Optional[str], every: float) -> None:
    """Runs the job every `every` seconds while `leader` leads; returns once it is lost."""
    epoch = leader.epoch
    print(f"leading epoch={epoch} member={leader.member_id}", flush=True)
    run, tick = 0, time.monotonic()
    while True:
        # Losing comes first: the job does not run once more after the broker said another
        # replica may lead.
        lost = leader.wait_lost(timeout=max(0.0, tick - time.monotonic()))
        if lost is not None:
            print(f"lost epoch={epoch}: {lost.error or lost.cause.value}", flush=True)
            return
        tick += every
        run += 1
        try:
            if store is not None:
                fenced_append(store, epoch, run)
        except Fenced as error:
            # Only a deposed leader is refused: stop, and rejoin once the broker says so.
            print(f"refused epoch={epoch} run={run}: {error}", flush=True)
            lost = leader.wait_lost()
            print(f"lost epoch={epoch}: {lost.error if lost else 'resigned'}", flush=True)
            return
        except StoreFailed as error:
            print(f"failed epoch={epoch} run={run}: {error} (trying again)", flush=True)
        else:
            print(f"epoch={epoch} run={run}", flush=True)


def replicate(args: dict[str, Optional[str]]) -> int:
    every = int(args["every-ms"] or "1000") / 1000
    store, group, server = args["store"], args["group"] or "scheduler", args["server"] or ""
    try:
        client = tinybroker.Client(server, tinybroker.ClientOptions(token=args["token"]))
    except tinybroker.TinybrokerError as error:
        print(f"scheduler: cannot reach the broker at {server}: {error}", file=sys.stderr)
        return 1
    with client:
        # Waits in line; rejoins by itself with backoff if the broker goes away meanwhile.
        leaderships = client.leaderships(
            "scheduler", group, on_standby=lambda p: print(f"standby position={p}", flush=True)
        )
        try:
            for leader in leaderships:
                # Leaving a lost leadership is quiet; leaving on an exception (the
                # KeyboardInterrupt of SIGTERM or Ctrl-C) resigns at once.
                with leader:
                    lead(leader, store, every)
        except tinybroker.TinybrokerError as error:
            print(f"scheduler: cannot join the election: {error}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str]) -> int:
    try:
        args = parse(argv)
    except ValueError as error:
        print(f"scheduler: {error}", file=sys.stderr)
        return 2
    # SIGTERM (`kill PID`) as Ctrl-C: a KeyboardInterrupt in the main thread, wherever it
    # waits (in line, or between runs). The leader resigns at once and the standby leads.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return replicate(args)
    except KeyboardInterrupt:
        print("stopped", flush=True)
        return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
