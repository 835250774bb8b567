"""The worker example as real processes: SIGTERM of one worker midway loses no ack."""

from __future__ import annotations

import queue
import re
import signal
import time

from conftest import WAIT, Deployment, Process, python_example

import tinybroker
from tinybroker import Message

JOB = re.compile(r"^job system_id=(\d+) topic=\S+ attempt=(\d+) payload=\"(\d+)\"$")


def jobs_of(worker: Process, until: float) -> list[tuple[int, int, int]]:
    """(system_id, attempt, n) of every job line read until the monotonic time `until`, or
    until the worker's output ends."""
    out = []
    while time.monotonic() < until:
        try:
            line = worker.lines.next(timeout=max(0.0, until - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        m = JOB.match(line)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
    return out


def test_sigterm_of_a_worker_midway_loses_no_ack(
    deployment: Deployment, processes: list[Process]
) -> None:
    n_jobs = 300
    a = python_example("worker.py", "--server", deployment.members.url, "--window", "4", tag="a")
    b = python_example("worker.py", "--server", deployment.publishers.url, "--window", "4", tag="b")
    processes += [a, b]
    a.wait_for(r"waiting for jobs")
    b.wait_for(r"waiting for jobs")
    with tinybroker.Client(deployment.publishers.url) as client:
        for start in range(0, n_jobs, 100):
            client.publish_batch(
                [Message(f"jobs.n{n % 7}", str(n)) for n in range(start, start + 100)]
            )
        # Let A work through part of the queue, then stop it midway with SIGTERM.
        done_by_a: list[tuple[int, int, int]] = []
        while len(done_by_a) < 40:
            m = a.wait_for(JOB.pattern)
            done_by_a.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
        a.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WAIT
        done_by_a += jobs_of(a, deadline)
        assert a.process.wait(WAIT) == 0, a.errors.seen
        assert "stopped; every ack applied" in a.lines.seen
        # B does the rest: each job exactly once across both workers.
        done_by_b: list[tuple[int, int, int]] = []
        while len({j[2] for j in done_by_a + done_by_b}) < n_jobs:
            missing = sorted(set(range(n_jobs)) - {j[2] for j in done_by_a + done_by_b})
            if time.monotonic() >= deadline:
                views = [
                    tinybroker.Client(u).describe("jobs")
                    for u in {deployment.members.url, deployment.publishers.url}
                ]
                raise AssertionError(
                    f"B did not finish the queue: {len(missing)} jobs missing "
                    f"({missing[:10]}); A did {len(done_by_a)}, B {len(done_by_b)}; {views}; "
                    f"A: {[j for j in done_by_a if j[2] in missing]} B's last: {b.lines.seen[-3:]}"
                )
            done_by_b += jobs_of(b, min(deadline, time.monotonic() + 1))
        ids_a = [j[0] for j in done_by_a]
        ids_b = [j[0] for j in done_by_b]
        assert not set(ids_a) & set(ids_b), "a job A processed (and acked) was handed to B"
        assert len(ids_a) == len(set(ids_a)) and len(ids_b) == len(set(ids_b))
        assert sorted(j[2] for j in done_by_a + done_by_b) == list(range(n_jobs))
        assert 40 <= len(ids_a) < n_jobs
        if deployment.name == "embedded":
            info = client.describe("jobs")
            assert info.counters.acked == n_jobs and info.in_flight == 0, info
