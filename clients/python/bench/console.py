#!/usr/bin/env python3
"""The live web console's weight, speed and idle cost (docs/operations.md#console).

One broker, started here on free loopback ports (`serve --console`, `--idle-timeout 30m`, and
`--max-subscriptions` raised to leave room above `--subscriptions`), holds `--subscriptions`
SINGLETON subscriptions made by `tinybroker bench w4`, memberless once it ends (checked on
/api/overview). Then, in this order:

1. page weight: the bytes of /, /assets/console.js, /assets/console.css and
   /assets/favicon.svg as served (no compression is offered or asked for), and their total;
2. idle cost: the broker's CPU over `--seconds` (utime + stime from /proc/<pid>/stat, as percent
   of one core) and its RSS (VmRSS at the window's end), first with no console open, then with
   `--consoles` plain HTTP clients reading /api/stream?view=overview (each has had its first
   event before the window starts; what they receive in the window is counted). No browser runs
   yet, and no member is joined;
3. first render, in headless Chromium: from navigation start (the page's time origin) until the
   overview's first `#subscriptions tr[data-id]` is in the DOM (a MutationObserver, installed
   before the page's scripts, takes performance.now()); a fresh navigation from about:blank
   each rep;
4. failover on the page: per rep a new SINGLETON subscription with two members (Python client),
   the page freshly opened on #/subscriptions/<id> and showing the first member active; the
   active member's stream is closed and the time until `#sub-epoch` shows a higher epoch is
   taken as the MutationObserver's performance.timeOrigin + performance.now() minus this
   process's time.time() just before the close call. The page's clock is read against
   time.time() just before each close (one WebDriver round trip, bracketed) and the largest
   difference printed, so a drifting browser clock would show. For reference, when the
   standby member itself was told (its Activation, awaited in a thread started before the
   close). The other member leaves, and the subscription is deleted, after each rep.

Each step prints a human line; the last line is every figure as one JSON object. Run it with
the venv's Python (selenium and the `tinybroker` package; .ci/run sets it up) and Debian's
chromium and chromium-driver:

    python3 clients/python/bench/console.py [--subscriptions 10000] [--consoles 10]
        [--seconds 30] [--reps 5] [--binary PATH]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

import tinybroker
from tinybroker import Activation, Standby, SubscriptionOptions

REPO = Path(__file__).resolve().parents[3]
ASSETS = ["/", "/assets/console.js", "/assets/console.css", "/assets/favicon.svg"]
#: How long any one wait may take (a join, a page showing something, the broker's log line).
WAIT = 60.0
#: How often a wait looks at the page (each look is one WebDriver round trip).
POLL = 0.01
#: Before each idle window: the broker settles after the last thing this script did.
SETTLE = 2.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

#: In every document, before the page's scripts: performance.now() when the overview's first
#: row is in the DOM (null until then).
FIRST_ROW = """
window.__tbFirstRow = null;
const firstRow = new MutationObserver(() => {
  if (window.__tbFirstRow === null && document.querySelector('#subscriptions tr[data-id]')) {
    window.__tbFirstRow = performance.now();
    firstRow.disconnect();
  }
});
firstRow.observe(document, { childList: true, subtree: true });
"""

#: Whether the subscription page shows member `arguments[0]` active at epoch `arguments[1]`.
SHOWS_ACTIVE = """
const text = (id) => { const e = document.getElementById(id); return e ? e.textContent : null; };
return text('sub-active-member') === arguments[0] && text('sub-epoch') === arguments[1];
"""

#: performance.timeOrigin + performance.now() (ms since the Unix epoch) when `#sub-epoch` first
#: shows an epoch above `arguments[0]`.
WATCH_EPOCH = """
const [epoch] = arguments;
window.__tbSeen = null;
const above = () => {
  const e = document.getElementById('sub-epoch');
  return e !== null && /^[0-9]+$/.test(e.textContent) && BigInt(e.textContent) > BigInt(epoch);
};
const watch = new MutationObserver(() => {
  if (window.__tbSeen === null && above()) {
    window.__tbSeen = performance.timeOrigin + performance.now();
    watch.disconnect();
  }
});
watch.observe(document.body, { subtree: true, childList: true, characterData: true });
if (above()) { window.__tbSeen = performance.timeOrigin + performance.now(); watch.disconnect(); }
"""


def broker_env() -> dict[str, str]:
    """This environment, without a token (the console would then ask for it) and at the log
    level that says where the broker listens."""
    env = {**os.environ, "RUST_LOG": "info"}
    for name in ("TINYBROKER_AUTH_TOKEN", "TINYBROKER_AUTH_TOKEN_FILE"):
        env.pop(name, None)
    return env


class BrokerProcess:
    """`tinybroker serve` with its console, both on free loopback ports."""

    def __init__(self, binary: Path, max_subscriptions: int) -> None:
        self.process = subprocess.Popen(
            [
                str(binary),
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--console",
                "127.0.0.1:0",
                "--idle-timeout",
                "30m",
                "--max-subscriptions",
                str(max_subscriptions),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=broker_env(),
        )
        self.log: collections.deque[str] = collections.deque(maxlen=20)
        self.url = ""
        self.console = ""
        try:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.log.append(line.rstrip())
                listening = re.search(r"listening on (\S+)", line)
                if listening:
                    self.url = f"http://{listening.group(1)}"
                console = re.search(r"console at (https?://\S+?)/?(\s|$)", line)
                if console:
                    self.console = console.group(1)
                    break
            if not (self.url and self.console):
                raise SystemExit(
                    "the broker exited before its console listened:\n" + "\n".join(self.log)
                )
        except BaseException:
            self.stop()
            raise
        # Keep draining its log so it never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.rstrip())

    @property
    def pid(self) -> int:
        return self.process.pid

    def check(self) -> None:
        if self.process.poll() is not None:
            raise SystemExit(
                f"the broker exited ({self.process.returncode}):\n" + "\n".join(self.log)
            )

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def get(url: str) -> tuple[bytes, dict[str, str]]:
    with urllib.request.urlopen(url, timeout=WAIT) as r:
        return r.read(), {k.lower(): v for k, v in r.headers.items()}


def overview(console: str) -> dict[str, Any]:
    body, _ = get(console + "/api/overview")
    found: dict[str, Any] = json.loads(body)
    return found


def make_subscriptions(binary: Path, broker: BrokerProcess, n: int) -> float:
    """`bench w4` makes `n` SINGLETON subscriptions; returns how long it took, once the broker
    holds them, memberless."""
    start = time.perf_counter()
    subprocess.run(
        [str(binary), "bench", "--server", broker.url, "w4", "--subscriptions", str(n)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        check=True,
        env=broker_env(),
    )
    took = time.perf_counter() - start
    deadline = time.monotonic() + WAIT
    while True:
        figures = overview(broker.console)["broker"]
        if figures["subscriptions"] == n and figures["members"] == 0:
            return took
        if time.monotonic() > deadline:
            raise SystemExit(f"after w4 the broker holds {figures}, not {n} memberless")
        time.sleep(0.1)


# --- 1. page weight ------------------------------------------------------------------------------


def page_weight(console: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for path in ASSETS:
        body, headers = get(console + path)
        encoding = headers.get("content-encoding", "identity")
        if encoding != "identity":
            raise SystemExit(f"{path} came {encoding}-encoded though none was asked for")
        length = headers.get("content-length")
        if length is not None and int(length) != len(body):
            raise SystemExit(f"{path}: content-length {length}, body {len(body)} bytes")
        sizes[path] = len(body)
    sizes["total"] = sum(sizes.values())
    return sizes


# --- 2. idle cost --------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """The process's utime + stime so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # After "pid (comm) ": field 3 (state) first, so utime (14) and stime (15) at 11 and 12.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no VmRSS in /proc/{pid}/status")


class StreamReader:
    """A plain HTTP client on /api/stream?view=overview that reads everything it is sent."""

    def __init__(self, console: str) -> None:
        host, port = console.removeprefix("http://").split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=WAIT)
        self.connection.request(
            "GET", "/api/stream?view=overview", headers={"Accept": "text/event-stream"}
        )
        sock = self.connection.sock
        assert isinstance(sock, socket.socket)
        self.sock = sock
        self.response = self.connection.getresponse()
        content_type = self.response.getheader("content-type", "")
        if self.response.status != 200 or not content_type.startswith("text/event-stream"):
            raise SystemExit(f"/api/stream answered {self.response.status} {content_type}")
        # An idle console may send nothing for as long as the window lasts.
        self.sock.settimeout(None)
        self.lock = threading.Lock()
        self.events = 0
        self.bytes = 0
        self.first = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for line in self.response:
                with self.lock:
                    self.bytes += len(line)
                    if line.startswith(b"event:"):
                        self.events += 1
                        self.first.set()
        except (OSError, http.client.HTTPException):
            if not self.stopping:
                raise

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.events, self.bytes

    def close(self) -> None:
        self.stopping = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(WAIT)
        self.connection.close()


def idle_window(
    broker: BrokerProcess, seconds: float, readers: list[StreamReader]
) -> dict[str, float]:
    """The broker's CPU (percent of one core) over `seconds` after SETTLE, its RSS at the end,
    and with `readers` what each received in the window (mean)."""
    time.sleep(SETTLE)
    broker.check()
    before = [r.counts() for r in readers]
    cpu, start = cpu_seconds(broker.pid), time.monotonic()
    time.sleep(seconds)
    cpu, wall = cpu_seconds(broker.pid) - cpu, time.monotonic() - start
    rss = rss_bytes(broker.pid)
    after = [r.counts() for r in readers]
    broker.check()
    figures = {"cpu_percent": cpu / wall * 100, "rss_bytes": float(rss)}
    if readers:
        figures["events_per_console"] = statistics.mean(a[0] - b[0] for a, b in zip(after, before))
        figures["bytes_per_console"] = statistics.mean(a[1] - b[1] for a, b in zip(after, before))
    return figures


def idle_with_consoles(broker: BrokerProcess, consoles: int, seconds: float) -> dict[str, float]:
    readers: list[StreamReader] = []
    try:
        for _ in range(consoles):
            readers.append(StreamReader(broker.console))
        for r in readers:
            if not r.first.wait(WAIT):
                raise SystemExit("a console stream sent no first event")
        return idle_window(broker, seconds, readers)
    finally:
        for r in readers:
            r.close()


# --- 3 and 4. the browser ------------------------------------------------------------------------


def browser() -> WebDriver:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,800",
    ):
        options.add_argument(argument)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        chrome.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": FIRST_ROW})
    except BaseException:
        chrome.quit()
        raise
    return chrome


def wait_for(chrome: WebDriver, script: str, what: str, *args: object) -> Any:
    """The script's answer once it is neither null nor false."""
    return WebDriverWait(chrome, WAIT, poll_frequency=POLL).until(
        lambda d: d.execute_script(script, *args), f"the page did not show {what} within {WAIT} s"
    )


def navigate(chrome: WebDriver, url: str) -> None:
    """A fresh navigation (from about:blank), checked to be one."""
    chrome.get("about:blank")
    chrome.get(url)
    kind = chrome.execute_script("return performance.getEntriesByType('navigation')[0].type;")
    if kind != "navigate":
        raise SystemExit(f"{url} was loaded by a {kind}, not a fresh navigation")


def first_render(chrome: WebDriver, console: str) -> float:
    navigate(chrome, console + "/")
    ms = wait_for(chrome, "return window.__tbFirstRow;", "a subscription's row")
    return float(ms)


def page_clock_offset(chrome: WebDriver) -> tuple[float, float]:
    """The page's clock (time origin + now) minus time.time(), ms, and the uncertainty (half
    the round trip)."""
    before = time.time()
    page = float(chrome.execute_script("return performance.timeOrigin + performance.now();"))
    after = time.time()
    return page - (before + after) / 2 * 1000, (after - before) / 2 * 1000


def failover(
    chrome: WebDriver, client: tinybroker.Client, console: str, sid: str
) -> dict[str, float]:
    """One failover of a new subscription `sid`, on a page freshly opened on it."""
    options = SubscriptionOptions.election(sid, "console-bench")
    joined: list[tinybroker.Subscription] = []
    done = False
    try:
        a = client.subscribe(options, timeout=WAIT)
        joined.append(a)
        first = a.active(WAIT)
        b = client.subscribe(options, timeout=WAIT)
        joined.append(b)
        standby = b.next_event(WAIT)
        if not isinstance(standby, Standby):
            raise SystemExit(f"the second member got {standby}, not a standby notice")
        navigate(chrome, f"{console}/#/subscriptions/{sid}")
        wait_for(
            chrome,
            SHOWS_ACTIVE,
            f"{first.member_id} active at epoch {first.epoch}",
            str(first.member_id),
            str(first.epoch),
        )
        chrome.execute_script(WATCH_EPOCH, str(first.epoch))

        told: list[float] = []
        activation: list[Activation] = []

        def await_activation(member: tinybroker.Subscription) -> None:
            activation.append(member.active(WAIT))
            told.append(time.time())

        waiter = threading.Thread(target=await_activation, args=(b,), daemon=True)
        waiter.start()
        offset, uncertainty = page_clock_offset(chrome)
        closed_at = time.time()
        a.close(WAIT)
        joined.remove(a)
        seen = float(wait_for(chrome, "return window.__tbSeen;", "a higher epoch"))
        waiter.join(WAIT)
        if not activation or activation[0].epoch <= first.epoch:
            raise SystemExit(f"the standby was not promoted: {activation}")
        epoch = chrome.execute_script("return document.getElementById('sub-epoch').textContent;")
        if epoch != str(activation[0].epoch):
            raise SystemExit(f"the page shows epoch {epoch}, not {activation[0].epoch}")
        done = True
        return {
            "page_ms": seen - closed_at * 1000,
            "standby_ms": (told[0] - closed_at) * 1000,
            "clock_offset_ms": offset,
            "clock_uncertainty_ms": uncertainty,
        }
    finally:
        for member in joined:
            if done:
                member.close(WAIT)
            else:
                # What went wrong matters more than a clean leave.
                with contextlib.suppress(tinybroker.TinybrokerError, TimeoutError):
                    member.close(WAIT)
        if done:
            # Back to the memberless subscriptions of w4 alone.
            client.delete_subscription(sid, timeout=WAIT)


# --- the report ----------------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "all": [round(v, 1) for v in values],
        "median": round(statistics.median(values), 1),
        "max": round(max(values), 1),
    }


def ms_line(what: str, values: list[float]) -> str:
    each = " ".join(f"{v:.1f}" for v in values)
    return f"{what}, ms: {each}; median {statistics.median(values):.1f}, max {max(values):.1f}"


def idle_line(consoles: int, figures: dict[str, float], seconds: float) -> str:
    line = (
        f"idle broker, {consoles} console{'' if consoles == 1 else 's'} open: "
        f"CPU {figures['cpu_percent']:.2f}% of one core over {seconds:g} s, "
        f"RSS {figures['rss_bytes'] / 2**20:.1f} MiB"
    )
    if consoles:
        line += (
            f"; each console received {figures['events_per_console']:.1f} events, "
            f"{figures['bytes_per_console']:,.0f} bytes"
        )
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscriptions", type=int, default=10000)
    parser.add_argument("--consoles", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--binary", type=Path, default=REPO / "target" / "release" / "tinybroker")
    args = parser.parse_args()
    if args.subscriptions < 1 or args.reps < 1 or args.seconds <= 0:
        parser.error("--subscriptions and --reps must be at least 1, --seconds above 0")
    if not 1 <= args.consoles <= 64:
        parser.error("--consoles: 1 to 64 (the console serves at most 64 open pages)")
    started = time.perf_counter()
    n = args.subscriptions
    broker = BrokerProcess(args.binary, max(10000, n + 16))
    chrome: Optional[WebDriver] = None
    client: Optional[tinybroker.Client] = None
    try:
        print(f"broker pid {broker.pid}: gRPC {broker.url}, console {broker.console}", flush=True)
        w4 = make_subscriptions(args.binary, broker, n)
        print(f"{n} memberless SINGLETON subscriptions made by bench w4 in {w4:.1f} s", flush=True)

        weight = page_weight(broker.console)
        parts = ", ".join(f"{p} {weight[p]:,}" for p in ASSETS)
        print(f"page weight, bytes: {parts}; total {weight['total']:,}", flush=True)

        idle = idle_window(broker, args.seconds, [])
        print(idle_line(0, idle, args.seconds), flush=True)
        busy = idle_with_consoles(broker, args.consoles, args.seconds)
        print(idle_line(args.consoles, busy, args.seconds), flush=True)

        chrome = browser()
        renders = [first_render(chrome, broker.console) for _ in range(args.reps)]
        print(ms_line(f"first render with {n} subscriptions", renders), flush=True)

        client = tinybroker.Client(broker.url)
        failovers = [
            failover(chrome, client, broker.console, f"console-bench-{os.getpid()}-{rep}")
            for rep in range(args.reps)
        ]
        page_ms = [f["page_ms"] for f in failovers]
        standby_ms = [f["standby_ms"] for f in failovers]
        worst = max(failovers, key=lambda f: abs(f["clock_offset_ms"]))
        print(ms_line("failover on the page (close call to #sub-epoch)", page_ms), flush=True)
        print(
            ms_line("  the standby member told (close call to its Activation)", standby_ms)
            + f"; page clock vs time.time(): at most {worst['clock_offset_ms']:+.2f} ms "
            f"(±{worst['clock_uncertainty_ms']:.2f})",
            flush=True,
        )
        broker.check()
    finally:
        if client is not None:
            client.close()
        if chrome is not None:
            chrome.quit()
        broker.stop()
    took = time.perf_counter() - started
    print(f"took {took:.1f} s", flush=True)
    report = {
        "bench": "console",
        "subscriptions": n,
        "consoles": args.consoles,
        "seconds": args.seconds,
        "reps": args.reps,
        "w4_s": round(w4, 2),
        "page_bytes": weight,
        "idle": {
            "0": {
                "cpu_percent": round(idle["cpu_percent"], 3),
                "rss_bytes": int(idle["rss_bytes"]),
            },
            str(args.consoles): {
                "cpu_percent": round(busy["cpu_percent"], 3),
                "rss_bytes": int(busy["rss_bytes"]),
                "events_per_console": busy["events_per_console"],
                "bytes_per_console": busy["bytes_per_console"],
            },
        },
        "first_render_ms": summary(renders),
        "failover_page_ms": summary(page_ms),
        "failover_standby_ms": summary(standby_ms),
        "page_clock_offset_ms": [round(f["clock_offset_ms"], 2) for f in failovers],
        "took_s": round(took, 1),
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
