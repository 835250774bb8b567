"""The live web console (`serve --console`, docs/operations.md#console) in headless Chromium,
against the real broker: embedded, and over two gateways with the members on one gateway and
the console on the other, so the page shows them through the cluster.

One page, never reloaded, follows a SINGLETON subscription: the overview's row, then the
subscription's page through a failover (the active member's stream closed: the standby is
shown active with a higher epoch, within a second in both deployments, and the timeline
says "closed stream") and a hand-over asked on the page itself (confirmed in its dialog; the
timeline says "hand-over"). A member's hostile metadata shows as text, and the page records no
alert, no CSP violation and no script error. On a failure the page's screenshot is saved as
target/console-failure-<deployment>.png; after a passing embedded run, the subscription page is
saved as docs/images/console.png, the README's picture.

And, without a browser: the token (401 without it) and the read-only and cross-site guards on
POST (403).

The browser is Debian's `chromium` with its `chromium-driver` (.ci/run installs them), given to
Selenium explicitly so that it downloads nothing. Without them the browser test is skipped,
except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Union

import pytest
from conftest import REPO, TARGET, WAIT, Broker, Gateways, binary, out_loud, unique
from selenium import webdriver
from selenium.common.exceptions import (
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.command import Command
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

import tinybroker
from tinybroker import Activation, Standby, SteppedDown, SubscriptionOptions

#: What the active member's metadata says: the page must show it as text.
HOSTILE = "<img src=x onerror=alert(1)>"
#: The viewport, and so the size of docs/images/console.png.
WIDTH, HEIGHT = 1280, 800
#: A failover through the embedded broker is on the page within this (from the close call).
EMBEDDED_BOUND = 1.0
#: Through gateways the promotion goes through the cluster, and the console of the other
#: gateway shows it within the same second (measured 28-252 ms on a loopback cluster; each run
#: prints its own).
GATEWAY_BOUND = 1.0
#: How often a wait looks at the page (each look is one WebDriver round trip).
POLL = 0.02
#: The README's picture.
DOCS_IMAGE = REPO / "docs" / "images" / "console.png"

#: Run in every document before the page's own scripts: records what must not happen.
RECORDER = """
window.__tb = { alerts: [], csp: [], errors: [] };
window.alert = (message) => { window.__tb.alerts.push(String(message)); };
document.addEventListener('securitypolicyviolation', (e) => {
  const where = `${e.sourceFile}:${e.lineNumber}`;
  window.__tb.csp.push(`${e.violatedDirective} blocked ${e.blockedURI} at ${where}`);
});
window.addEventListener('error', (e) => {
  if (e instanceof ErrorEvent) {
    window.__tb.errors.push(`${e.message} at ${e.filename}:${e.lineno}`);
  } else {
    const t = e.target || {};
    const tag = (t.tagName || '?').toLowerCase();
    window.__tb.errors.push(`failed to load <${tag}> ${t.src || t.href || ''}`);
  }
}, true);
window.addEventListener('unhandledrejection', (e) => {
  window.__tb.errors.push(`unhandled rejection: ${e.reason}`);
});
"""

#: Everything the waits look at, in one round trip.
VIEW = """
const text = (root, css) => { const e = root.querySelector(css); return e ? e.textContent : null; };
const sub = document.getElementById('subscription');
const result = document.getElementById('action-result');
const dialog = document.getElementById('confirm');
const hand = document.getElementById('hand-over');
return {
  hash: location.hash,
  status: text(document, '#status'),
  rows: Object.fromEntries([...document.querySelectorAll('#subscriptions tr[data-id]')].map(
    (r) => [r.dataset.id, { active: text(r, '.active'), epoch: text(r, '.epoch') }])),
  page: sub ? sub.dataset.id : null,
  active: text(document, '#sub-active-member'),
  epoch: text(document, '#sub-epoch'),
  metadata: text(document, '#sub-active-metadata'),
  line: [...document.querySelectorAll('#line tr.member')].map((r) => ({
    member: r.dataset.member, state: text(r, '.state'), position: text(r, '.position'),
    metadata: text(r, '.metadata') })),
  timeline: [...document.querySelectorAll('#timeline li.epoch')].map((li) => ({
    epoch: li.dataset.epoch, member: text(li, '.tl-member'), cause: text(li, '.cause') })),
  charts: document.querySelectorAll('#charts svg').length,
  points: [...document.querySelectorAll('#charts polyline')].map((p) => p.points.numberOfItems),
  hand_over: hand ? (hand.disabled ? 'disabled' : 'enabled') : null,
  dialog: dialog && dialog.open ? text(dialog, '#confirm-text') : null,
  result: result && !result.hidden ? { class: result.className, text: result.textContent } : null,
  hostile_images: [...document.querySelectorAll('img')].filter(
    (i) => i.getAttribute('src') === 'x').length,
  loaded_once: window.__tbLoaded === true,
  record: window.__tb,
};
"""

#: Records (Date.now()) when the subscription page first shows `member` active with an epoch
#: above `epoch`: the DOM change itself, not when a wait polled it.
WATCH_PROMOTION = """
const [member, epoch] = arguments;
window.__tbSeen = null;
const shown = () => {
  const m = document.getElementById('sub-active-member');
  const e = document.getElementById('sub-epoch');
  return m && e && m.textContent === member && /^[0-9]+$/.test(e.textContent)
    && BigInt(e.textContent) > BigInt(epoch);
};
const observer = new MutationObserver(() => {
  if (window.__tbSeen === null && shown()) { window.__tbSeen = Date.now(); observer.disconnect(); }
});
observer.observe(document.body, { subtree: true, childList: true, characterData: true });
if (shown()) { window.__tbSeen = Date.now(); observer.disconnect(); }
"""


# --- the browser -------------------------------------------------------------------------------


def browser_paths() -> tuple[str, str]:
    """Debian's chromium and chromedriver; skipped without them, except in CI."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    missing = " and ".join(
        n for n, p in (("chromium", chromium), ("chromedriver", driver)) if not p
    )
    message = (
        f"no {missing} on this machine: install Debian's chromium and chromium-driver "
        "(`apt-get install -y chromium chromium-driver`, as .ci/run does)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI: {message}", pytrace=False)
    pytest.skip(message)


class Page:
    """The console in a headless Chromium, and waits on what it shows."""

    def __init__(self) -> None:
        chromium, driver = browser_paths()
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for argument in (
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--disable-gpu",
            f"--window-size={WIDTH},{HEIGHT}",
        ):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(driver), options=options)
        try:
            self.driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
            )
            self.driver.execute_cdp_cmd(
                "Page.addScriptToEvaluateOnNewDocument", {"source": RECORDER}
            )
        except BaseException:
            self.driver.quit()
            raise

    def open(self, url: str) -> None:
        self.driver.get(url)
        # Gone if the page ever reloads.
        self.driver.execute_script("window.__tbLoaded = true;")

    def view(self) -> dict[str, Any]:
        view: dict[str, Any] = self.driver.execute_script(VIEW)
        return view

    def until(
        self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = WAIT
    ) -> dict[str, Any]:
        """The page's view once `check` holds of it, looked at every POLL seconds."""
        seen: list[dict[str, Any]] = []

        def look(_: WebDriver) -> Union[dict[str, Any], Literal[False]]:
            view = self.view()
            seen[:] = [view]
            return view if check(view) else False

        try:
            found: dict[str, Any] = WebDriverWait(self.driver, timeout, poll_frequency=POLL).until(
                look
            )
            return found
        except TimeoutException:
            raise AssertionError(
                f"the console did not show {what} within {timeout} s; it shows "
                f"{json.dumps(seen[0] if seen else None, indent=1)}"
            ) from None

    def click(self, css: str) -> None:
        """A real click on `css`. The page rebuilds its tables on each update (at least every
        second while open), so an element found just before one is gone by the click: found
        again then."""

        def clicked(driver: WebDriver) -> bool:
            driver.find_element(By.CSS_SELECTOR, css).click()
            return True

        WebDriverWait(
            self.driver,
            WAIT,
            poll_frequency=POLL,
            ignored_exceptions=(StaleElementReferenceException,),
        ).until(clicked, f"no {css} to click")

    def type(self, css: str, text: str) -> None:
        self.driver.find_element(By.CSS_SELECTOR, css).send_keys(text)

    def browser_log(self) -> list[str]:
        """The console's log lines of level SEVERE since the last call."""
        # What `get_log("browser")` does, typed.
        entries: list[dict[str, Any]] = self.driver.execute(Command.GET_LOG, {"type": "browser"})[
            "value"
        ]
        return [str(e.get("message")) for e in entries if e.get("level") == "SEVERE"]

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        png = self.driver.get_screenshot_as_png()
        assert png_size(png) == (WIDTH, HEIGHT), f"screenshot of {png_size(png)}, not the viewport"
        path.write_bytes(png)

    def close(self) -> None:
        self.driver.quit()


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR", "not a PNG"
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)


@pytest.fixture
def page() -> Iterator[Page]:
    p = Page()
    yield p
    p.close()


# --- deployments -------------------------------------------------------------------------------


class ConsoleDeployment:
    """Where the members join, and whose console the page shows."""

    def __init__(self, name: str, members: Broker, console: Broker) -> None:
        self.name = name
        self.members = members
        self.console = console


@pytest.fixture(params=["embedded", "gateways"])
def console_deployment(request: pytest.FixtureRequest) -> Iterator[ConsoleDeployment]:
    if request.param == "embedded":
        b = Broker([], console="127.0.0.1:0")
        yield ConsoleDeployment("embedded", b, b)
        b.close()
    else:
        g: Gateways = request.getfixturevalue("gateways")
        yield ConsoleDeployment("gateways", g.a, g.b)


# --- the browser test --------------------------------------------------------------------------


def causes(view: dict[str, Any]) -> dict[str, Optional[str]]:
    return {t["epoch"]: t["cause"] for t in view["timeline"]}


def line_of(view: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {m["member"]: (m["state"], m["position"]) for m in view["line"]}


def test_the_console_follows_a_failover_and_a_hand_over_live(
    page: Page, console_deployment: ConsoleDeployment
) -> None:
    # `page` first: without a browser it skips (or fails, in CI) before any broker starts.
    d = console_deployment
    started = time.monotonic()
    client = tinybroker.Client(d.members.url)
    subscriptions: list[tinybroker.Subscription] = []
    try:
        latency = follow_a_subscription(d, page, client, subscriptions)
        assert page.browser_log() == [], "the browser logged errors"
        if d.name == "embedded":
            docs_picture(page, client, subscriptions)
    except BaseException:
        failure = TARGET / f"console-failure-{d.name}.png"
        try:
            page.screenshot(failure)
            with out_loud(f"console test ({d.name}) failed: the page is in {failure}"):
                pass
        except (WebDriverException, AssertionError, OSError) as e:
            with out_loud(f"console test ({d.name}) failed, and no screenshot: {e}"):
                pass
        raise
    finally:
        for s in subscriptions:
            try:
                s.close(WAIT)
            except (tinybroker.TinybrokerError, TimeoutError):
                pass  # what the test saw matters more than a clean leave
        client.close()
    bound = EMBEDDED_BOUND if d.name == "embedded" else GATEWAY_BOUND
    took = time.monotonic() - started
    with out_loud(
        f"console ({d.name}): the failover was on the page {latency * 1000:.0f} ms after the "
        f"close call (bound {bound * 1000:.0f} ms); the test took {took:.1f} s"
    ):
        pass


def follow_a_subscription(
    d: ConsoleDeployment,
    page: Page,
    client: tinybroker.Client,
    subscriptions: list[tinybroker.Subscription],
) -> float:
    """The page through a join, a failover and a hand-over; returns the failover's latency."""
    sid = unique("console")
    options = SubscriptionOptions.election(sid, "workers")

    # The overview, open before anything joins: the row comes live.
    page.open(d.console.console_url + "/")
    page.until("the live badge", lambda v: v["status"] == "live")
    page.type("#search", sid)
    page.until("the search in the address", lambda v: v["hash"] == f"#/?q={sid}&page=1")

    a = client.subscribe(options.with_(metadata=HOSTILE), timeout=WAIT)
    subscriptions.append(a)
    first = a.active(WAIT)
    b = client.subscribe(options.with_(metadata="host=worker-b"), timeout=WAIT)
    subscriptions.append(b)
    standby = b.next_event(WAIT)
    assert isinstance(standby, Standby) and standby.position == 1, standby
    a_id, b_id, e1 = str(first.member_id), str(standby.member_id), str(first.epoch)

    row = {"active": f"{a_id} · {HOSTILE}", "epoch": e1}
    page.until(f"{sid}'s row with {a_id} active at epoch {e1}", lambda v: v["rows"].get(sid) == row)

    # Its page, through the row's link.
    page.click(f'#subscriptions tr[data-id="{sid}"] td.id a')
    view = page.until(
        f"{sid}'s page with {a_id} active and {b_id} next",
        lambda v: (
            v["page"] == sid
            and (v["active"], v["epoch"], v["metadata"]) == (a_id, e1, HOSTILE)
            and line_of(v) == {a_id: ("active", "0"), b_id: ("standby", "1")}
            and causes(v) == {e1: "current"}
        ),
    )
    assert view["hash"] == f"#/subscriptions/{sid}" and view["charts"] == 2, view
    assert {m["member"]: m["metadata"] for m in view["line"]} == {
        a_id: HOSTILE,
        b_id: "host=worker-b",
    }

    # Failover: A's stream ends; the page shows B active, without a reload.
    page.driver.execute_script(WATCH_PROMOTION, b_id, e1)
    closed_at = time.time()
    a.close(WAIT)
    subscriptions.remove(a)
    second = b.active(WAIT)
    assert second.member_id == standby.member_id and second.epoch > first.epoch
    e2 = str(second.epoch)
    bound = EMBEDDED_BOUND if d.name == "embedded" else GATEWAY_BOUND
    seen_ms = WebDriverWait(page.driver, WAIT, poll_frequency=POLL).until(
        lambda drv: drv.execute_script("return window.__tbSeen;")
    )
    latency = float(seen_ms) / 1000 - closed_at
    view = page.until(
        f"{b_id} active at epoch {e2}, and epoch {e1} ended by a closed stream",
        lambda v: (
            (v["active"], v["epoch"], v["metadata"]) == (b_id, e2, "host=worker-b")
            and line_of(v) == {b_id: ("active", "0")}
            and causes(v) == {e2: "current", e1: "closed stream"}
        ),
    )
    assert [t["epoch"] for t in view["timeline"]] == [e2, e1], "newest first"
    assert latency < bound, (
        f"{d.name}: the promotion showed {latency:.3f} s after the close call (bound {bound} s)"
    )

    # A joins again, on standby; a hand-over asked on the page makes it active.
    a2 = client.subscribe(options.with_(metadata=HOSTILE), timeout=WAIT)
    subscriptions.append(a2)
    again = a2.next_event(WAIT)
    assert isinstance(again, Standby), again
    a2_id = str(again.member_id)
    page.until(
        f"{a2_id} on standby",
        lambda v: (
            line_of(v) == {b_id: ("active", "0"), a2_id: ("standby", "1")}
            and v["hand_over"] == "enabled"
        ),
    )
    page.click("#hand-over")
    view = page.until("the confirmation dialog", lambda v: v["dialog"] is not None)
    assert sid in view["dialog"] and "Hand-over" in view["dialog"], view["dialog"]
    page.click("#confirm-yes")
    third = a2.active(WAIT)
    assert isinstance(third, Activation) and third.epoch > second.epoch
    stepped = b.next_event(WAIT)
    assert stepped == SteppedDown(second.member_id, second.epoch, 1), stepped
    e3 = str(third.epoch)
    view = page.until(
        f"the hand-over's result, {a2_id} active at epoch {e3}, epoch {e2} ended by hand-over",
        lambda v: (
            v["result"] is not None
            and v["result"]["class"] == "ok"
            and (v["active"], v["epoch"]) == (a2_id, e3)
            and line_of(v) == {a2_id: ("active", "0"), b_id: ("standby", "1")}
            and causes(v) == {e3: "current", e2: "hand-over", e1: "closed stream"}
        ),
    )
    assert a2_id in view["result"]["text"] and e3 in view["result"]["text"], view["result"]
    assert view["dialog"] is None, "the dialog closed"

    # The hostile metadata is text, and nothing ran, loaded or was refused.
    assert view["metadata"] == HOSTILE
    assert {m["member"]: m["metadata"] for m in view["line"]}[a2_id] == HOSTILE
    assert view["hostile_images"] == 0
    assert view["record"] == {"alerts": [], "csp": [], "errors": []}, view["record"]
    assert view["loaded_once"], "the page reloaded"
    assert view["hash"] == f"#/subscriptions/{sid}"
    return latency


# --- the README's picture -----------------------------------------------------------------------


def docs_picture(
    page: Page, client: tinybroker.Client, subscriptions: list[tinybroker.Subscription]
) -> None:
    """A subscription as an operator sees one: three replicas with plain metadata, messages
    published (ten a second) and acked, a failover and a hand-over (the timeline), a few
    seconds of rates (the charts); its page saved as docs/images/console.png."""
    sid = "reports.nightly"
    options = SubscriptionOptions.election(sid, "schedulers")
    ackers: dict[int, tuple[tinybroker.Subscription, threading.Thread]] = {}
    done = threading.Event()

    def ack_all(member: tinybroker.Subscription) -> None:
        for delivery in member:  # until interrupt()
            delivery.ack()

    def publish() -> None:
        n = 0
        while not done.wait(0.1):  # the rate the charts show
            client.publish(f"election.{sid}", f"report {n}", timeout=WAIT)
            n += 1

    def join(metadata: str) -> tinybroker.Subscription:
        member = client.subscribe(options.with_(metadata=metadata), timeout=WAIT)
        subscriptions.append(member)
        thread = threading.Thread(target=ack_all, args=(member,), daemon=True)
        thread.start()
        ackers[id(member)] = (member, thread)
        return member

    def stop(member: tinybroker.Subscription) -> None:
        member.interrupt()
        ackers.pop(id(member))[1].join(WAIT)

    def charted(v: dict[str, Any], samples: int) -> bool:
        return len(v["points"]) == 2 and min(v["points"]) >= samples

    page.driver.execute_script("location.hash = arguments[0];", f"#/subscriptions/{sid}")
    first = join("host=sched-1 zone=eu-west-1a v2.4.1")
    join("host=sched-2 zone=eu-west-1b v2.4.1")
    join("host=sched-3 zone=eu-west-1c v2.4.1")
    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        page.until("the picture's first rates", lambda v: charted(v, 2))
        stop(first)
        first.close(WAIT)
        subscriptions.remove(first)
        page.until("the picture's failover", lambda v: len(v["timeline"]) == 2 and charted(v, 4))
        client.hand_over(sid, timeout=WAIT)
        page.until(
            "the picture's subscription: three epochs, two members, some seconds of rates",
            lambda v: len(v["timeline"]) == 3 and len(v["line"]) == 2 and charted(v, 6),
        )
        page.driver.execute_script("window.scrollTo(0, 0);")
        page.screenshot(DOCS_IMAGE)
    finally:
        done.set()
        publisher.join(WAIT)
        for member, _ in list(ackers.values()):
            stop(member)
    with out_loud(f"console: saved the subscription page as {DOCS_IMAGE}"):
        pass


# --- the HTTP guards, without a browser ---------------------------------------------------------


def http(
    url: str, method: str = "GET", headers: Optional[dict[str, str]] = None
) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, method=method, headers=headers or {}, data=None)
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as r:
            return r.status, lower(r.headers.items()), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, lower(e.headers.items()), e.read().decode()


def lower(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Headers by their lower-case names."""
    return {k.lower(): v for k, v in headers}


def test_the_console_asks_for_the_token_and_guards_its_actions(tmp_path: Path) -> None:
    """With a token, every request needs it (Bearer, or Basic with it as password); a POST
    without the cross-site header is refused, and a read-only console refuses actions."""
    token = "console-s3cret"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    guarded = Broker(["--auth-token-file", str(token_file)], console="127.0.0.1:0")
    read_only = Broker(["--console-read-only"], console="127.0.0.1:0")
    try:
        url = guarded.console_url
        bearer = {"Authorization": f"Bearer {token}"}
        for path in ("/", "/assets/console.js", "/api/overview"):
            status, headers, _ = http(url + path)
            assert status == 401, (path, status)
            assert headers.get("www-authenticate", "").startswith("Basic "), headers
            assert http(url + path, headers={"Authorization": "Bearer wrong"})[0] == 401
        status, headers, body = http(url + "/", headers=bearer)
        assert status == 200 and 'id="subscriptions"' in body, (status, body[:200])
        assert "script-src 'self'" in headers.get("content-security-policy", ""), headers
        basic = base64.b64encode(f"operator:{token}".encode()).decode()
        assert http(url + "/", headers={"Authorization": f"Basic {basic}"})[0] == 200

        # The cross-site guard: without its header a POST is refused before anything else.
        hand_over = "/api/subscriptions/x/hand-over"
        status, _, body = http(url + hand_over, "POST", bearer)
        assert status == 403, (status, body)
        status, _, body = http(url + hand_over, "POST", {**bearer, "X-Tinybroker-Console": "1"})
        assert status == 404 and json.loads(body)["code"] == "NOT_FOUND", (status, body)

        # Read-only: shown, not acted on.
        url = read_only.console_url
        status, _, body = http(url + "/api/overview")
        assert status == 200 and json.loads(body)["read_only"] is True, (status, body)
        for path in (hand_over, "/api/subscriptions/x/delete"):
            status, _, body = http(url + path, "POST", {"X-Tinybroker-Console": "1"})
            assert status == 403, (path, status, body)
            assert json.loads(body)["code"] == "PERMISSION_DENIED", body
            assert http(url + path, "POST")[0] == 403
    finally:
        guarded.close()
        read_only.close()


# --- the shipped benchmark ---------------------------------------------------------------------


def test_the_console_benchmark_runs_and_reports_its_figures() -> None:
    """docs/performance.md#console's command, small: it reports every figure it promises."""
    browser_paths()
    script = REPO / "clients" / "python" / "bench" / "console.py"
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "--subscriptions",
            "20",
            "--consoles",
            "2",
            "--seconds",
            "1",
            "--reps",
            "1",
            "--binary",
            str(binary()),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["subscriptions"] == 20
    assert report["page_bytes"]["total"] > 10_000
    assert report["first_render_ms"]["median"] > 0
    assert report["failover_page_ms"]["median"] > 0
    assert set(report["idle"]) == {"0", "2"}
