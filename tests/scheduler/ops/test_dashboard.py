"""`chordflow dashboard`: the runs view, in a real headless Chromium against a live cluster.

The page is driven by selenium through Debian's chromium + chromedriver (`make test` installs them when
missing). The dashboard runs as its own process (`python -m scheduler.cli dashboard`), on the suite's
cluster (tests/support/cluster.py: a real redis-server and two workers). Waits are on page content
(WebDriverWait) and on the processes' own output, never sleeps.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import scheduler
from scheduler.localcluster import Cluster, ManagedProcess, free_port
from scheduler.ops.dashboard import USERS_VARIABLE
from tests.scheduler.cli.test_cli import run_cli
from tests.scheduler.ops.test_metrics import PRICE, llm_workflow
from tests.support import llm_server
from tests.support.kinds import starts
from worker.llm import fake

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
USER, PASSWORD = "ops", "s3cret-dashboard"
READY = "Uvicorn running on"


@contextlib.contextmanager
def dashboard(workdir: Path, env: dict[str, str], *args: str) -> Iterator[str]:
    """`chordflow dashboard` as a process on a free port; yields its base URL once it listens."""
    port = free_port()
    argv = [sys.executable, "-m", "scheduler.cli", "dashboard", "--port", str(port), *args]
    server = ManagedProcess(argv, workdir / f"dashboard-{port}.log", READY, env=env)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.kill(signal.SIGTERM)


def request(url: str, *, auth: tuple[str, str] | None = None, method: str = "GET", **headers: str) -> tuple[int, Any]:
    """(status, headers) of one request; the body is not read (an event stream never ends)."""
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=30) as r:
            return r.status, r.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != USERS_VARIABLE}
    return {**env, **more}


# -- auth, without a browser ----------------------------------------------------------------------------


@pytest.mark.processes
def test_dashboard_refuses_to_start_without_basic_auth() -> None:
    argv = [sys.executable, "-m", "scheduler.cli", "dashboard", "--port", str(free_port())]
    missing = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        f"error: set {USERS_VARIABLE} to user:password (or pass --unauthenticated) to start the dashboard"
    ]
    malformed = subprocess.run(argv, env=_env(**{USERS_VARIABLE: "nopassword"}), capture_output=True, text=True)
    assert malformed.returncode == 2
    assert malformed.stderr.splitlines() == [f"error: {USERS_VARIABLE} must be user:password[,user2:password2]"]


@pytest.mark.processes
def test_dashboard_answers_401_without_credentials(tmp_path: Path) -> None:
    with dashboard(tmp_path, _env(**{USERS_VARIABLE: f"someone:else,{USER}:{PASSWORD}"})) as base:
        for path in ("/", "/api/runs", "/api/runs/events", "/api/runs/r1/failed"):
            status, headers = request(base + path)
            assert status == 401, path
            assert headers["WWW-Authenticate"] == 'Basic realm="chordflow"'
        assert request(base + "/", auth=(USER, "wrong"))[0] == 401
        assert request(base + "/api/runs/r1/cancel", method="POST", **{"X-Chordflow-Action": "1"})[0] == 401
        status, headers = request(base + "/", auth=(USER, PASSWORD))
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        # An action without the page's header (a form of another site) is refused before anything runs.
        assert request(base + "/api/runs/r1/cancel", auth=(USER, PASSWORD), method="POST")[0] == 403


@pytest.mark.processes
def test_dashboard_unauthenticated_is_an_explicit_choice(tmp_path: Path) -> None:
    with dashboard(tmp_path, _env(), "--unauthenticated") as base:
        assert request(base + "/")[0] == 200


# -- what every answer says, and what none says ------------------------------------------------

FRAMING = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'"}


def _answer(url: str, *, method: str = "GET", **headers: str) -> tuple[int, Any, str]:
    """(status, headers, body) of a request with the dashboard's credentials (and the action header)."""
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    headers = {"Authorization": f"Basic {token}", "X-Chordflow-Action": "1", **headers}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=30) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def _framing(headers: Any) -> dict[str, list[str]]:
    return {name: headers.get_all(name) for name in FRAMING}


def _first_event(url: str) -> Any:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=30) as stream:
        assert _framing(stream.headers) == {k: [v] for k, v in FRAMING.items()}
        for line in stream:
            if line.startswith(b"data: "):
                return json.loads(line.removeprefix(b"data: "))
    raise AssertionError("the stream ended without data")


def test_every_answer_forbids_framing_checks_run_ids_and_names_no_server_path(
    celery_cluster: Cluster, tmp_path: Path
) -> None:
    expected = {k: [v] for k, v in FRAMING.items()}
    with dashboard(tmp_path, {**celery_cluster.env, USERS_VARIABLE: f"{USER}:{PASSWORD}"}) as base:
        # Clickjacking: no page may frame the dashboard, whatever it answers (401s and event streams too).
        for path in ("/", "/api/runs", "/api/runs/r1/events"):
            status, headers = request(base + path)
            assert (status, _framing(headers)) == (401, expected), path
        status, headers, body = _answer(base + "/")
        assert (status, _framing(headers)) == (200, expected) and "<script>" in body  # inline script still runs
        status, headers, body = _answer(base + "/api/runs")
        assert (status, _framing(headers), headers["Content-Type"]) == (200, expected, "application/json")
        status, headers = request(base + "/api/runs/events", auth=(USER, PASSWORD))
        assert (status, _framing(headers)) == (200, expected)
        assert headers["Content-Type"].startswith("text/event-stream")
        status, headers, _ = _answer(base + "/no/such/page")
        assert (status, _framing(headers)) == (404, expected)

        # A run id that cannot name a run is refused before any lookup, and never echoed.
        script = urllib.parse.quote("<img src=x onerror=alert(1)>", safe="")
        for bad in ("x" * 129, script, "a%20b", "r%0Aun"):
            for method, suffix in (("GET", ""), ("GET", "/failed"), ("GET", "/events"), ("POST", "/cancel")):
                status, headers, body = _answer(f"{base}/api/runs/{bad}{suffix}", method=method)
                assert (status, json.loads(body), _framing(headers)) == (400, {"error": "invalid run id"}, expected)
        # An unknown run: its id (checked) and no more; the store's file is not named.
        for method, suffix in (("GET", ""), ("GET", "/failed"), ("POST", "/resume"), ("POST", "/redrive")):
            status, headers, body = _answer(f"{base}/api/runs/no-such.run_1{suffix}", method=method)
            assert (status, json.loads(body)) == (404, {"error": "run no-such.run_1: unknown run"}), suffix
            assert "runs.db" not in body and "/" not in json.loads(body)["error"]
        event = _first_event(f"{base}/api/runs/no-such.run_1/events")
        assert event["error"] == "run no-such.run_1: unknown run"
        status, _, body = _answer(f"{base}/api/runs/r1/explode", method="POST")
        assert (status, json.loads(body)) == (404, {"error": "unknown action (one of: cancel, resume, redrive)"})


# -- the page in Chromium, on a live cluster --------------------------------------------------------------


@pytest.fixture
@starts("browser")
def browser() -> Iterator[Any]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are needed: `make browser` installs Debian's chromium packages")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        # The credentials a user types in the browser's prompt: sent with every request of the page.
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}})
        yield driver
    finally:
        driver.quit()


def _read(driver: Any, selector: str, attribute: str | None = None) -> str | None:
    """An element's attribute (else its text), read in the page in one step: the live updates redraw rows, and an
    element found in one WebDriver call could be gone by the next (a stale element reference, seen in CI)."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "return e ? (arguments[1] ? e.getAttribute(arguments[1]) : e.textContent) : null;",
        selector,
        attribute,
    )


def _done(driver: Any, node: str) -> int:
    value = _read(driver, f'#nodes tr[data-node="{node}"] td.progress', "data-done")
    return int(value) if value else -1


def test_page_shows_live_progress_failed_items_and_cancels_a_run(
    celery_cluster: Cluster, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    workflow = {
        "name": "dashboard-check",
        "nodes": [
            {"id": "check", "type": "test-fail", "params": {"value": "${item}", "fail_on": 3},
             "batch": {"items": "${few}", "error_handling": "continue"}},
            {"id": "slow", "type": "test-slow", "params": {"seconds": 0.05},
             "batch": {"items": "${many}", "chunk_size": 10}},
        ],
        "edges": [{"from": "check", "to": "slow"}],
    }  # fmt: skip
    run_id = scheduler.submit(workflow, {"few": list(range(6)), "many": list(range(4000))})
    wait = WebDriverWait(browser, 60)
    with dashboard(tmp_path, {**celery_cluster.env, USERS_VARIABLE: f"{USER}:{PASSWORD}"}) as base:
        browser.get(base + "/")
        row = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f'#runs tr[data-run="{run_id}"]')))
        assert "dashboard-check" in row.text
        browser.execute_script("window.loadedOnce = true;")  # gone if anything reloaded the page
        row.click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "run-id"), run_id))

        # Progress moves on the page while the batch runs (server-sent events, no reload).
        first = wait.until(lambda d: (n := _done(d, "slow")) > 0 and n)
        wait.until(lambda d: _done(d, "slow") > first)
        assert browser.find_element(By.ID, "run-status").text == "running"
        assert _read(browser, '#nodes tr[data-node="slow"] td.progress', "data-total") == "4000"

        # The failed item of the finished `check` batch, with its error, in the failed items table.
        wait.until(lambda d: "boom 3" in (_read(d, '#failed tr[data-index="3"]') or ""))
        assert browser.execute_script('return document.querySelectorAll("#failed tbody tr").length;') == 1

        # Cancel: the button asks first, then the run ends `cancelled` — on the page and in the run store.
        browser.find_element(By.ID, "cancel").click()
        wait.until(ec.alert_is_present()).accept()
        wait.until(ec.text_to_be_present_in_element((By.ID, "run-status"), "cancelled"))
        assert scheduler.status(run_id)["status"] == "cancelled"
        assert _done(browser, "slow") < 4000
        assert browser.find_element(By.ID, "cancel").get_attribute("disabled") == "true"
        assert browser.execute_script("return window.loadedOnce === true;")


def _usage(driver: Any, selector: str) -> dict[str, float]:
    """The model-call numbers an element shows (its data-calls, data-input-tokens, ... attributes)."""
    names = ("calls", "cached-calls", "input-tokens", "output-tokens", "cost-usd")
    found = {name: _read(driver, selector, f"data-{name}") for name in names}
    return {name: float(text) for name, text in found.items() if text is not None}


def test_the_page_shows_what_a_local_and_a_cluster_runs_model_calls_cost(
    celery_cluster: Cluster, browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    # A local run against the loopback provider, priced: the provider counts what it billed.
    items = [f"translate item number {i}" for i in range(5)]
    with llm_server.serving() as provider:
        for name, setting in llm_server.environment(provider).items():
            monkeypatch.setenv(name, setting)
        monkeypatch.setenv("CHORDFLOW_LLM_PRICES", json.dumps({"openai/gpt-test": PRICE}))
        local = scheduler.run(llm_workflow(), {"items": items}, shared={"__llm_calls__": []}).run_id
    tokens_in, tokens_out = provider.tokens()
    cost = (tokens_in * PRICE["input"] + tokens_out * PRICE["output"]) / 1_000_000
    # A cluster run of the offline model (the suite's workers have no provider keys, nor prices): tokens only.
    prompts = ["one two three", "four five", "six"]
    node = {"id": "each", "type": "llm", "params": {"prompt": "${item}", "model": "fake"}, "batch": {"items": "${p}"}}
    cluster = scheduler.submit({"nodes": [node]}, {"p": prompts, "__llm_calls__": []})
    assert scheduler.wait(cluster, timeout=120).status == "success"
    fake_counts = [fake.answer("fake", None, prompt, 1.0)[1:] for prompt in prompts]

    wait = WebDriverWait(browser, 60)
    with dashboard(tmp_path, {**celery_cluster.env, USERS_VARIABLE: f"{USER}:{PASSWORD}"}) as base:
        browser.get(base + "/")
        local_row, cluster_row = (f'#runs tr[data-run="{run_id}"] td.llm' for run_id in (local, cluster))
        wait.until(lambda d: _usage(d, local_row) and _usage(d, cluster_row))
        billed = {"calls": 7, "cached-calls": 1, "input-tokens": tokens_in, "output-tokens": tokens_out,
                  "cost-usd": pytest.approx(cost)}  # fmt: skip
        assert _usage(browser, local_row) == billed
        assert _usage(browser, cluster_row) == {
            "calls": 3, "cached-calls": 0, "input-tokens": sum(i for i, _ in fake_counts),
            "output-tokens": sum(o for _, o in fake_counts),
        }  # fmt: skip
        browser.get(f"{base}/#/run/{local}")
        wait.until(lambda d: _usage(d, "#run-llm"))
        assert _usage(browser, "#run-llm") == billed
        assert f"{tokens_out} output tokens, ${cost:.6f}" in (_read(browser, "#run-llm") or "")
    assert len(provider.billed()) == 6  # the `again` call was answered from the run's kept answer
    # What `status` and `results` say of the local run: the same numbers.
    assert scheduler.status(local)["llm"] == {
        "calls": 7, "cached_calls": 1, "input_tokens": tokens_in, "output_tokens": tokens_out,
        "cost_usd": pytest.approx(cost),
    }  # fmt: skip
    results = run_cli("results", local)
    assert results.returncode == 0, results.stderr
    line = f"llm: 7 calls (1 answered from kept answers), {tokens_in} input tokens, {tokens_out} output tokens"
    assert f"{line}, ${cost:.4f}" in results.stderr


def test_failed_items_are_paged_in_index_order(celery_cluster: Cluster, tmp_path: Path) -> None:
    """Pages of a batch's failed items (skip/limit over the stored outcomes), read through the API."""
    workflow = {
        "nodes": [{"id": "odd", "type": "echo", "params": {"value": "${item}"},
                   "batch": {"items": "${items}", "error_handling": "continue", "chunk_size": 7}}]
    }  # fmt: skip
    values = [f"Error: item {i}" if i % 2 else f"ok {i}" for i in range(60)]
    run_id = scheduler.submit(workflow, {"items": values})
    scheduler.wait(run_id, timeout=120)
    env = {**celery_cluster.env, USERS_VARIABLE: f"{USER}:{PASSWORD}"}
    with dashboard(tmp_path, env) as base:
        pages, skip = [], 0
        while True:
            page = _get_json(f"{base}/api/runs/{run_id}/failed?node=odd&skip={skip}&limit=12")
            pages.append([item["index"] for item in page["items"]])
            if not page["more"]:
                break
            skip += 12
    assert pages == [list(range(1 + 24 * p, min(60, 24 * (p + 1)), 2)) for p in range(3)]


def _post(url: str) -> tuple[int, Any]:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    headers = {"Authorization": f"Basic {token}", "X-Chordflow-Action": "1"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST", headers=headers)) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_resume_and_redrive_buttons_hand_runs_back_to_the_workers(celery_cluster: Cluster, tmp_path: Path) -> None:
    """The buttons' endpoints: a failed run resumed, a failed dataset job's records redriven and listed."""
    fix, log = tmp_path / "fixed", tmp_path / "log"
    step = {"id": "work", "type": "test-side-effect", "params": {"log": str(log), "label": "x", "requires": str(fix)}}
    failed_run = scheduler.submit({"nodes": [step]})
    job = {
        "inputs": {"record": {}},
        "nodes": [{**step, "params": {**step["params"], "label": "${record.n}"}}],
        "outputs": {"label": {"source": "${work.label}"}},
    }
    failed_job = scheduler.submit(job, items=[{"n": n} for n in range(12)], chunk_size=5)
    for run_id in (failed_run, failed_job):
        with contextlib.suppress(Exception):  # the run's own FileNotFoundError, raised again by wait
            scheduler.wait(run_id, timeout=120)
        assert scheduler.status(run_id)["status"] == "failed"
    with dashboard(tmp_path, {**celery_cluster.env, USERS_VARIABLE: f"{USER}:{PASSWORD}"}) as base:
        page = _get_json(f"{base}/api/runs/{failed_job}/failed?skip=10&limit=5")
        assert [item["index"] for item in page["items"]] == [10, 11] and not page["more"]
        assert page["items"][0]["error"] == f"missing {fix}"
        assert _post(f"{base}/api/runs/{failed_run}/redrive") == (
            409, {"error": f"run {failed_run} is not a dataset job (--items); use `chordflow resume`"}
        )  # fmt: skip
        fix.touch()
        assert _post(f"{base}/api/runs/{failed_run}/resume") == (
            200,
            {"message": f"run {failed_run} resumed on the cluster"},
        )
        assert _post(f"{base}/api/runs/{failed_job}/redrive") == (
            200,
            {"message": f"run {failed_job}: 12 records to run again"},
        )
        assert scheduler.wait(failed_run, timeout=120).status == "success"
        assert scheduler.wait(failed_job, timeout=120).status == "success"
        assert _post(f"{base}/api/runs/{failed_run}/cancel") == (
            409,
            {"error": f"run {failed_run} already ended: succeeded"},
        )


def _get_json(url: str) -> Any:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})) as r:
        return json.load(r)


def test_make_test_installs_the_browser_and_make_run_does_not(tmp_path: Path) -> None:
    """`make test` installs chromium + chromedriver when missing (Debian packages); `make run` never does."""
    if shutil.which("make") is None:
        pytest.skip("needs make")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}

    def dry_run(target: str) -> str:
        argv = ["make", "--no-print-directory", "-n", target, f"VENV={tmp_path / 'venv'}"]
        root = Path(__file__).parents[3]
        return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=True).stdout

    assert "apt-get install -y -q chromium chromium-driver" in dry_run("test")
    assert f"test -x {CHROMIUM} -a -x {CHROMEDRIVER}" in dry_run("test")
    assert "apt-get" not in dry_run("run")
