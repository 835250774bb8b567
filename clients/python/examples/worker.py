#!/usr/bin/env python3
"""A queue worker: the Python twin of the Rust `examples/worker.rs`, on the asyncio API (a
service is usually asyncio). Competing consumers share the messages of `jobs.>`, each acked
after it is processed; a worker that dies mid-job has its message redelivered to another with
`attempt` + 1. Ctrl-C or SIGTERM stops it cleanly: it finishes the job in hand and closes its
subscription, which returns once the broker has applied every ack, so no job it did is done
again.

    python3 worker.py                                  # in two terminals
    python3 worker.py --server http://127.0.0.1:50051 --window 8
    tinybroker publish jobs.email 'send the welcome mail'

Start the workers first: a message published while no subscription matches its topic is not
kept (`queued_for` is 0). Rust workers (`cargo run --example worker`) share the same queue.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import tinybroker
from tinybroker.aio import Client, ClientOptions

USAGE = """usage: worker.py [--server URL] [--window N] [--token TOKEN]

  --server URL    broker URL (default http://127.0.0.1:50051, env TINYBROKER_SERVER)
  --window N      unacked messages this worker may hold (default 1)
  --token TOKEN   bearer token (env TINYBROKER_AUTH_TOKEN)
"""


async def work(server: str, window: int, token: str | None) -> int:
    try:
        client = await Client.connect(server, ClientOptions(token=token))
    except tinybroker.TinybrokerError as error:
        print(f"worker: cannot reach the broker at {server}: {error}", file=sys.stderr)
        return 1
    async with client:
        jobs = tinybroker.SubscriptionOptions.queue("jobs", "workers", ["jobs.>"])
        try:
            subscription = await client.subscribe(jobs.with_(max_in_flight=window))
            member = await subscription.active()
        except tinybroker.TinybrokerError as error:
            print(f"worker: cannot subscribe: {error}", file=sys.stderr)
            return 1
        # A signal stops the iteration at the next wait, never between a job and its ack.
        stopping = asyncio.Event()

        def stop() -> None:
            stopping.set()
            subscription.interrupt()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        print(f"waiting for jobs on jobs.> as member {member.member_id}", flush=True)
        try:
            async for delivery in subscription:
                # The work. It must be idempotent: a redelivery (attempt > 1) may repeat it.
                payload = json.dumps(delivery.payload.decode("utf-8", "replace"))
                print(
                    f"job system_id={delivery.system_id} topic={delivery.topic} "
                    f"attempt={delivery.attempt} payload={payload}",
                    flush=True,
                )
                delivery.ack()
        except tinybroker.TinybrokerError as error:
            print(f"worker: the subscription ended: {error}", file=sys.stderr)
            return 1
        if not stopping.is_set():
            print("worker: the broker ended the subscription", file=sys.stderr)
            return 1
        # `ack` only queued the acks; returning now could lose the last ones, and the broker
        # would hand those jobs to another worker.
        try:
            await subscription.close()
        except tinybroker.TinybrokerError as error:
            print(f"worker: closing: {error}", file=sys.stderr)
            return 1
        print("stopped; every ack applied", flush=True)
        return 0


def main(argv: list[str]) -> int:
    server = os.environ.get("TINYBROKER_SERVER", "http://127.0.0.1:50051")
    token = os.environ.get("TINYBROKER_AUTH_TOKEN")
    window = 1
    it = iter(argv)
    for flag in it:
        if flag in ("-h", "--help"):
            print(USAGE, end="")
            return 0
        value = next(it, None)
        if flag == "--server" and value is not None:
            server = value
        elif flag == "--token" and value is not None:
            token = value
        elif flag == "--window" and value is not None and value.isdigit() and int(value) > 0:
            window = int(value)
        else:
            print(USAGE, end="", file=sys.stderr)
            return 2
    return asyncio.run(work(server, window, token))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
