#!/usr/bin/env python3
"""Publish and ack throughput of the Python client against the Rust client, on one broker.

The workload is `tinybroker bench w1`'s: one publisher over `PublishStream` with up to 256
publishes unanswered, three queue consumers (each on a connection of its own) with window 1,
each message acked on the consumer's `Consume` stream. Reported as the Rust bench reports it:
publish rate (messages / time to the last publish answer) and acked rate (messages / time from
the first publish until every message was received and acked). The Rust client, the asyncio
API and the blocking API take turns on the same broker (`--rounds` times, interleaved), each
on a subscription of its own. Also: unary publishes, one at a time.

    python3 clients/python/bench/bench.py [--messages 20000] [--rounds 1] [--binary PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import tinybroker
from tinybroker import Message, SubscriptionOptions
from tinybroker.aio import Client

REPO = Path(__file__).resolve().parents[3]
PAYLOAD = b"x" * 128
CONSUMERS = 3


def drain(stream: object) -> None:
    for _ in stream:  # type: ignore[attr-defined]
        pass


def start_broker(binary: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [str(binary), "serve", "--listen", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    for line in process.stderr:
        match = re.search(r"listening on (\S+)", line)
        if match:
            # Keep draining its log so it never blocks on a full pipe.
            threading.Thread(target=drain, args=(process.stderr,), daemon=True).start()
            return process, f"http://{match.group(1)}"
    raise SystemExit("the broker exited before it listened")


def rust_w1(binary: Path, url: str, messages: int) -> dict[str, float]:
    out = subprocess.run(
        [str(binary), "bench", "--server", url, "--messages", str(messages), "w1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    return {"publish": report["publish_rate_per_s"], "acked": report["rate_per_s"]}


async def aio_w1(url: str, messages: int, sid: str) -> dict[str, float]:
    consumers = [await Client.connect(url) for _ in range(CONSUMERS)]
    subs = [
        await c.subscribe(SubscriptionOptions.queue(sid, "bench", [f"{sid}.*"])) for c in consumers
    ]
    for s in subs:
        await s.active()
    done = asyncio.Event()
    count = 0

    async def consume(sub: tinybroker.aio.Subscription) -> None:
        nonlocal count
        while not done.is_set():
            delivery = await sub.next_delivery()
            if delivery is None:
                return
            delivery.ack()
            count += 1
            if count >= messages:
                done.set()

    tasks = [asyncio.ensure_future(consume(s)) for s in subs]
    publisher_client = await Client.connect(url)
    publisher = await publisher_client.publisher()
    start = time.perf_counter()
    window: list[asyncio.Future[tinybroker.Published]] = []
    for _ in range(messages):
        window.append(await publisher.send(Message(f"{sid}.a", PAYLOAD)))
        if len(window) >= 256:
            await window.pop(0)
    for answer in window:
        await answer
    published = time.perf_counter() - start
    await done.wait()
    acked = time.perf_counter() - start
    for s in subs:
        s.interrupt()
    await asyncio.gather(*tasks)
    for s in subs:
        await s.close()
    await publisher.close()
    for c in [*consumers, publisher_client]:
        await c.close()
    return {"publish": messages / published, "acked": messages / acked}


def sync_w1(url: str, messages: int, sid: str) -> dict[str, float]:
    consumers = [tinybroker.Client(url) for _ in range(CONSUMERS)]
    subs = [c.subscribe(SubscriptionOptions.queue(sid, "bench", [f"{sid}.*"])) for c in consumers]
    for s in subs:
        s.active()
    lock = threading.Lock()
    count = 0
    finished = threading.Event()

    def consume(sub: tinybroker.Subscription) -> None:
        nonlocal count
        for delivery in sub:
            delivery.ack()
            with lock:
                count += 1
                if count >= messages:
                    finished.set()

    threads = [threading.Thread(target=consume, args=(s,)) for s in subs]
    for t in threads:
        t.start()
    with tinybroker.Client(url) as publisher_client:
        publisher = publisher_client.publisher()
        start = time.perf_counter()
        window = []
        for _ in range(messages):
            window.append(publisher.send(Message(f"{sid}.a", PAYLOAD)))
            if len(window) >= 256:
                window.pop(0).result()
        for answer in window:
            answer.result()
        published = time.perf_counter() - start
        finished.wait()
        acked = time.perf_counter() - start
        publisher.close()
    for s in subs:
        s.interrupt()
    for t in threads:
        t.join()
    for s, c in zip(subs, consumers):
        s.close()
        c.close()
    return {"publish": messages / published, "acked": messages / acked}


async def aio_unary(url: str, messages: int, sid: str) -> float:
    client = await Client.connect(url)
    sub = await client.subscribe(
        SubscriptionOptions.queue(sid, "bench", [f"{sid}.*"]).with_(max_in_flight=1)
    )
    await sub.active()
    start = time.perf_counter()
    for _ in range(messages):
        await client.publish(f"{sid}.a", PAYLOAD)
    rate = messages / (time.perf_counter() - start)
    sub._cancel()
    await client.close()
    return rate


async def aio_publish_alone(url: str, messages: int, sid: str) -> dict[str, float]:
    """The publisher with no consumer in this process (one subscription queues the messages),
    over the stream and in batches of 100."""
    client = await Client.connect(url)
    sub = await client.subscribe(SubscriptionOptions.queue(sid, "bench", [f"{sid}.*"]))
    await sub.active()
    publisher = await client.publisher()
    start = time.perf_counter()
    window: list[asyncio.Future[tinybroker.Published]] = []
    for _ in range(messages):
        window.append(await publisher.send(Message(f"{sid}.a", PAYLOAD)))
        if len(window) >= 256:
            await window.pop(0)
    for answer in window:
        await answer
    stream = messages / (time.perf_counter() - start)
    await publisher.close()
    start = time.perf_counter()
    for _ in range(0, messages, 100):
        await client.publish_batch([Message(f"{sid}.b", PAYLOAD)] * 100)
    batch = messages / (time.perf_counter() - start)
    sub._cancel()
    await client.close()
    return {"stream": stream, "batch": batch}


def rust_unary(binary: Path, url: str, messages: int) -> float:
    out = subprocess.run(
        [
            str(binary),
            "bench",
            "--server",
            url,
            "--messages",
            str(messages),
            "--publish",
            "unary",
            "--pipeline",
            "1",
            "w1",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["publish_rate_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--binary", type=Path, default=REPO / "target" / "release" / "tinybroker")
    args = parser.parse_args()
    process, url = start_broker(args.binary)
    rows: list[tuple[str, str, float]] = []
    try:
        for round_ in range(args.rounds):
            r = rust_w1(args.binary, url, args.messages)
            rows += [
                ("rust", "w1 publish (stream)", r["publish"]),
                ("rust", "w1 acked", r["acked"]),
            ]
            a = asyncio.run(aio_w1(url, args.messages, f"py-aio-{round_}"))
            rows += [("python asyncio", "w1 publish (stream)", a["publish"])]
            rows += [("python asyncio", "w1 acked", a["acked"])]
            s = sync_w1(url, args.messages, f"py-sync-{round_}")
            rows += [("python blocking", "w1 publish (stream)", s["publish"])]
            rows += [("python blocking", "w1 acked", s["acked"])]
            alone = asyncio.run(aio_publish_alone(url, args.messages, f"py-alone-{round_}"))
            rows.append(("python asyncio", "publish alone (stream)", alone["stream"]))
            rows.append(("python asyncio", "publish alone (batch 100)", alone["batch"]))
            unary = min(args.messages, 5000)
            rows.append(("rust", "unary publish, 1 at a time", rust_unary(args.binary, url, unary)))
            rows.append(
                (
                    "python asyncio",
                    "unary publish, 1 at a time",
                    asyncio.run(aio_unary(url, unary, f"py-unary-{round_}")),
                )
            )
    finally:
        process.kill()
        process.wait()
    print(f"{'client':<16} {'measure':<28} {'msg/s':>10}")
    for client, measure, rate in rows:
        print(f"{client:<16} {measure:<28} {rate:>10,.0f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
