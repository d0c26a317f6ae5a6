"""The `http` node against a real local ThreadingHTTPServer started per test module."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

import scheduler
from ir.errors import Throttled, ThrottledTooLong
from tests.support import http_server
from worker.nodes.http import HttpNode, parse_retry_after
from worker.store import NamespacedStore

RELEASE = threading.Event()  # /slow waits on it; the fixture sets it at teardown


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def reply(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Reply", "yes")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/json":
            self.reply(200, {"hello": "world", "query": urllib.parse.parse_qs(url.query)})
        elif url.path == "/text":
            self.reply(200, "plain ü text".encode(), "text/plain; charset=utf-8")
        elif url.path == "/headers":
            self.reply(200, {"token": self.headers.get("X-Token"), "accept": self.headers.get("Accept")})
        elif url.path == "/problem":
            self.reply(200, {"kind": "problem"}, "application/problem+json")
        elif url.path == "/slow":
            RELEASE.wait(10)
            self.reply(200, {"late": True})
        elif url.path == "/boom":
            self.reply(500, {"detail": "kaput"})
        else:
            self.reply(404, {"detail": "nope"})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        content_type = self.headers.get("Content-Type")
        received = json.loads(body) if content_type == "application/json" else body
        self.reply(201, {"method": "POST", "content_type": content_type, "received": received})

    do_PUT = do_POST


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    RELEASE.clear()
    with http_server.serving(Handler) as url:
        try:
            yield url
        finally:
            RELEASE.set()  # a handler still waiting returns before the server shuts down


@pytest.fixture
def refused_url() -> Iterator[str]:
    with http_server.refused_url() as url:
        yield url


def run_http(params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    node = HttpNode()
    node.params = params
    store: dict[str, Any] = {}
    return node._run(store), store


def test_get_json(base_url: str) -> None:
    action, out = run_http({"url": f"{base_url}/json"})
    assert action == "default"
    assert out["status"] == 200
    assert out["json"] == {"hello": "world", "query": {}}
    assert "body" not in out and "error" not in out
    assert out["headers"]["content-type"] == "application/json"


def test_text_response_is_written_as_body(base_url: str) -> None:
    _, out = run_http({"url": f"{base_url}/text"})
    assert out["body"] == "plain ü text"
    assert "json" not in out


def test_json_suffix_content_type_is_parsed(base_url: str) -> None:
    _, out = run_http({"url": f"{base_url}/problem"})
    assert out["json"] == {"kind": "problem"}


def test_post_json_body(base_url: str) -> None:
    payload = {"a": [1, 2], "b": None, "c": "ü"}
    action, out = run_http({"url": f"{base_url}/echo", "method": "post", "json": payload})
    assert action == "default"
    assert out["status"] == 201
    assert out["json"] == {"method": "POST", "content_type": "application/json", "received": payload}


def test_put_string_body_with_own_content_type(base_url: str) -> None:
    params = {"url": f"{base_url}/echo", "method": "PUT", "body": "raw text", "headers": {"content-type": "text/x"}}
    _, out = run_http(params)
    assert out["json"]["content_type"] == "text/x"
    assert out["json"]["received"] == "raw text"


def test_request_and_response_headers(base_url: str) -> None:
    _, out = run_http({"url": f"{base_url}/headers", "headers": {"X-Token": "abc", "Accept": "application/json"}})
    assert out["json"] == {"token": "abc", "accept": "application/json"}
    assert out["headers"]["x-reply"] == "yes"


def test_query_params_are_encoded_and_merged(base_url: str) -> None:
    params = {"q": "a b&c=d", "n": 3, "tag": ["x", "y"], "flag": True, "skip": None}
    _, out = run_http({"url": f"{base_url}/json?k=1", "params": params})
    assert out["json"]["query"] == {"k": ["1"], "q": ["a b&c=d"], "n": ["3"], "tag": ["x", "y"], "flag": ["true"]}


def test_not_found_is_the_error_action(base_url: str) -> None:
    action, out = run_http({"url": f"{base_url}/missing"})
    assert action == "error"
    assert out["status"] == 404
    assert out["error"] == "HTTP 404 Not Found"
    assert out["json"] == {"detail": "nope"}


def test_server_error_writes_into_the_namespace(base_url: str) -> None:
    root: dict[str, Any] = {}
    node = HttpNode()
    node.params = {"url": f"{base_url}/boom"}
    assert node._run(NamespacedStore(root, "call")) == "error"
    assert root["call"]["error"] == "HTTP 500 Internal Server Error"


def test_connection_refused_raises(refused_url: str) -> None:
    with pytest.raises(ConnectionError, match=r"GET http://127\.0\.0\.1:\d+/x failed"):
        run_http({"url": refused_url, "timeout": 5})


def test_timeout_raises(base_url: str) -> None:
    with pytest.raises(TimeoutError, match=r"/slow timed out after 0\.3s"):
        run_http({"url": f"{base_url}/slow", "timeout": 0.3})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "http: param 'url' is required"),
        ({"url": "file:///etc/passwd"}, "http: param 'url' must be an http"),
        ({"url": 5}, "http: param 'url' must be an http"),
        ({"url": "http://x", "method": "GE T"}, "http: param 'method'"),
        ({"url": "http://x", "headers": ["a"]}, "http: param 'headers' must be a dict"),
        ({"url": "http://x", "headers": {"a": {"b": 1}}}, "http: param 'headers' values"),
        ({"url": "http://x", "params": "q=1"}, "http: param 'params' must be a dict"),
        ({"url": "http://x", "json": {}, "body": "x"}, "http: params 'json' and 'body' are exclusive"),
        ({"url": "http://x", "body": 3}, "http: param 'body' must be a string"),
        ({"url": "http://x", "timeout": -1}, "http: param 'timeout'"),
    ],
)
def test_bad_params_raise_value_error(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run_http(params)


def test_end_to_end_get_and_use_the_json(base_url: str) -> None:
    workflow = {
        "nodes": [
            {"id": "fetch", "type": "http", "params": {"url": "${base}/json", "params": {"who": "${who}"}}},
            {"id": "use", "type": "echo", "params": {"hello": "${fetch.json.hello}", "who": "${fetch.json.query.who}"}},
        ]
    }
    result = scheduler.run(workflow, {"base": base_url, "who": "me & you"})
    assert result.status == "success"
    assert result.shared["use"] == {"hello": "world", "who": ["me & you"]}


def test_end_to_end_post_json_from_the_store(base_url: str) -> None:
    workflow = {
        "nodes": [
            {"id": "src", "type": "echo", "params": {"doc": {"id": 7}}},
            {
                "id": "send",
                "type": "http",
                "params": {"url": f"{base_url}/items", "method": "POST", "json": "${src.doc}"},
            },
        ]
    }
    result = scheduler.run(workflow)
    assert result.shared["send"]["json"]["received"] == {"id": 7}


def test_end_to_end_404_fails_the_run(base_url: str) -> None:
    result = scheduler.run({"nodes": [{"id": "get", "type": "http", "params": {"url": f"{base_url}/gone"}}]})
    assert result.status == "failed"
    assert "HTTP 404 Not Found" in (result.error or "")


def test_end_to_end_connection_refused_raises_after_retries(refused_url: str) -> None:
    workflow = {"nodes": [{"id": "get", "type": "http", "max_retries": 2, "params": {"url": refused_url}}]}
    with pytest.raises(ConnectionError, match="failed"):
        scheduler.run(workflow)


# -- pooled connections and backpressure: a keep-alive (HTTP/1.1) server counting what it was sent ------------


class KeepAlive(BaseHTTPRequestHandler):
    """HTTP/1.1, so connections stay open between requests. /n/<i> answers {"n": i} (after `sleep` s).
    /limit/<key> answers `status` (429 unless given) to the first `times` requests of <key> (-1: every one),
    with Retry-After `retry_after` when given, then 200 {"key", "served"}; /drop/<key> closes the connection
    without an answer to the first `times` (default 1) requests of <key>, then answers 200 {"key", "served"}."""

    protocol_version = "HTTP/1.1"
    served: dict[str, int] = {}
    lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def reply(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.do_GET()

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        _, kind, key = url.path.split("/", 2)
        if kind == "drop":  # the first `times` requests of <key>: read, then the connection closes with no answer
            with self.lock:
                served = self.served[key] = self.served.get(key, 0) + 1
            if served <= int(query.get("times", "1")):
                self.close_connection = True
                return
            self.reply(200, {"key": key, "served": served})
            return
        if kind == "n":
            time.sleep(float(query.get("sleep", "0")))
            self.reply(200, {"n": int(key)})
            return
        with self.lock:
            served = self.served[key] = self.served.get(key, 0) + 1
        times = int(query.get("times", "-1"))
        if times < 0 or served <= times:
            extra = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
            self.reply(int(query.get("status", "429")), {"slow": "down"}, extra)
        else:
            self.reply(200, {"key": key, "served": served})


@pytest.fixture
def keepalive() -> Iterator[http_server.LoopbackServer]:
    KeepAlive.served.clear()
    with http_server.running(KeepAlive) as server:
        yield server


def one_get(**node: Any) -> dict[str, Any]:
    """A workflow of one http GET of ${item} over `urls` (batch `continue`), node fields from `node`."""
    spec = {"id": "get", "type": "http", "params": {"url": "${item}"}}
    spec["batch"] = {"items": "${urls}", "error_handling": "continue"}
    spec.update(node)
    return {"nodes": [spec]}


def test_a_parallel_batch_reuses_pooled_connections(keepalive: http_server.LoopbackServer) -> None:
    workflow = one_get(batch={"items": "${urls}", "parallel": True, "max_concurrent": 8, "error_handling": "continue"})
    urls = [f"{keepalive.url}/n/{i}" for i in range(50)]
    result = scheduler.run(workflow, {"urls": urls}, backend="local")
    out = result.shared["get"]
    assert out["success_count"] == 50
    assert [r["json"]["n"] for r in out["results"]] == list(range(50))
    assert 1 <= keepalive.accepted <= 8  # 50 requests on at most one connection per thread


def test_calls_past_the_connection_cap_wait_for_a_pooled_connection(
    keepalive: http_server.LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 threads of 50 ms calls share CHORDFLOW_HTTP_CONNECTIONS=2 connections, and every call succeeds."""
    from worker.nodes import http

    monkeypatch.setenv("CHORDFLOW_HTTP_CONNECTIONS", "2")
    http._forget_client()  # this process's client is made again, with the cap
    try:
        batch = {"items": "${urls}", "parallel": True, "max_concurrent": 16, "error_handling": "continue"}
        urls = [f"{keepalive.url}/n/{i}?sleep=0.05" for i in range(48)]
        out = scheduler.run(one_get(batch=batch), {"urls": urls}, backend="local").shared["get"]
    finally:
        http._forget_client()  # the next test's client has the default cap again
    assert out["success_count"] == 48
    assert [r["json"]["n"] for r in out["results"]] == list(range(48))
    assert keepalive.accepted == 2


def test_429_with_retry_after_is_waited_out_without_using_an_attempt(keepalive: http_server.LoopbackServer) -> None:
    workflow = one_get(max_retries=1, batch={"items": "${urls}", "max_retries": 1, "error_handling": "continue"})
    started = time.monotonic()
    result = scheduler.run(workflow, {"urls": [f"{keepalive.url}/limit/ra?times=2&retry_after=0.2"]})
    out = result.shared["get"]
    assert out["success_count"] == 1 and out["errors"] is None
    assert out["results"][0]["json"] == {"key": "ra", "served": 3}  # the 200's body, after two 429s
    assert out["results"][0]["status"] == 200
    assert time.monotonic() - started >= 0.4  # both Retry-After waits were kept


def test_429_without_retry_after_backs_off_then_succeeds(keepalive: http_server.LoopbackServer) -> None:
    workflow = {"nodes": [{"id": "get", "type": "http", "params": {"url": f"{keepalive.url}/limit/bo?times=1"}}]}
    result = scheduler.run(workflow)
    assert result.status == "success"
    assert result.shared["get"]["json"] == {"key": "bo", "served": 2}


def test_always_429_fails_the_item_past_max_throttle_wait(keepalive: http_server.LoopbackServer) -> None:
    workflow = one_get(params={"url": "${item}", "max_throttle_wait": 0.5})
    urls = [f"{keepalive.url}/limit/never?retry_after=0.2", f"{keepalive.url}/n/1"]
    result = scheduler.run(workflow, {"urls": urls})
    out = result.shared["get"]
    assert (out["success_count"], out["error_count"]) == (1, 1)
    assert out["results"][0] is None  # never a success
    [error] = out["errors"]
    assert error["index"] == 0 and error["exception_type"] == "ThrottledTooLong"
    assert "HTTP 429 from http://127.0.0.1" in error["error"] and "throttled" in error["error"]
    assert KeepAlive.served["never"] == 3  # asked at 0, 0.2 and 0.4 s; the next wait would pass 0.5 s


def test_always_429_on_a_plain_node_fails_the_run(keepalive: http_server.LoopbackServer) -> None:
    params = {"url": f"{keepalive.url}/limit/plain?retry_after=0.2", "max_throttle_wait": 0.1}
    workflow = {"nodes": [{"id": "get", "type": "http", "params": params}]}
    with pytest.raises(ThrottledTooLong, match="HTTP 429 from"):
        scheduler.run(workflow)


def test_503_with_retry_after_is_waited_out(keepalive: http_server.LoopbackServer) -> None:
    url = f"{keepalive.url}/limit/busy?times=1&status=503&retry_after=0.1"
    result = scheduler.run({"nodes": [{"id": "get", "type": "http", "params": {"url": url}}]})
    assert result.status == "success"
    assert result.shared["get"]["json"] == {"key": "busy", "served": 2}


def test_503_without_retry_after_is_the_error_action(keepalive: http_server.LoopbackServer) -> None:
    action, out = run_http({"url": f"{keepalive.url}/limit/down?times=1&status=503"})
    assert action == "error"
    assert out["status"] == 503
    assert out["error"] == "HTTP 503 Service Unavailable"
    assert KeepAlive.served["down"] == 1  # not asked again


def test_throttled_message_masks_credentials(keepalive: http_server.LoopbackServer) -> None:
    node = HttpNode()
    node.params = {"url": f"{keepalive.url}/limit/auth", "params": {"api_token": "s3cr3t-v4lue"}}
    with pytest.raises(Throttled) as caught:
        node.exec(node.prep({}))
    assert "s3cr3t-v4lue" not in str(caught.value)
    assert str(caught.value).startswith("HTTP 429 from http://127.0.0.1:")
    assert caught.value.retry_after is None and caught.value.max_wait == 300


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("0", 0.0),
        ("0.2", 0.2),
        (" 120 ", 120.0),
        (7, 7.0),
        ("Wed, 21 Oct 1998 07:28:00 GMT", 0.0),  # in the past: ask again now
        ("Sun, 09 Sep 2001 01:47:40 GMT", 60.0),  # a minute after NOW
        ("Sun, 09 Sep 2001 01:47:40", None),  # no zone: not an HTTP-date
        (None, None),
        ("", None),
        ("-1", None),
        ("soon", None),
        ("nan", None),
        ("inf", None),
        (True, None),
    ],
)
def test_parse_retry_after(value: Any, seconds: float | None) -> None:
    assert parse_retry_after(value, now=1_000_000_000.0) == seconds  # 2001-09-09 01:46:40 GMT


def test_a_forked_child_opens_its_own_connection(keepalive: http_server.LoopbackServer) -> None:
    """The parent's pooled connection is never used by a child (two processes on one socket mix replies)."""
    assert run_http({"url": f"{keepalive.url}/n/1"})[1]["json"] == {"n": 1}
    assert keepalive.accepted == 1
    pid = os.fork()
    if pid == 0:  # the child: a request of its own, then leave without running the parent's cleanups
        code = 1
        try:
            code = 0 if run_http({"url": f"{keepalive.url}/n/2"})[1]["json"] == {"n": 2} else 1
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert keepalive.accepted == 2  # the child connected anew
    assert run_http({"url": f"{keepalive.url}/n/3"})[1]["json"] == {"n": 3}
    assert keepalive.accepted == 2  # and the parent's connection is still its own, alive


def test_an_idempotent_request_whose_connection_broke_is_sent_once_more(keepalive: http_server.LoopbackServer) -> None:
    # The server reads the GET and closes the connection without answering (a kept-alive connection dropped
    # under a request): sent again on a fresh connection, it succeeds, within one attempt of the node.
    result = scheduler.run(one_get(), {"urls": [f"{keepalive.url}/drop/get-once"]})
    out = result.shared["get"]
    assert out["success_count"] == 1
    assert out["results"][0]["json"] == {"key": "get-once", "served": 2}


def test_a_post_whose_connection_broke_is_not_sent_again(keepalive: http_server.LoopbackServer) -> None:
    # A POST may have reached the server: it is never repeated behind the node's back (max_retries decides).
    node = {"id": "post", "type": "http", "params": {"url": "${item}", "method": "POST", "json": {"a": 1}}}
    node["batch"] = {"items": "${urls}", "error_handling": "continue"}
    out = scheduler.run({"nodes": [node]}, {"urls": [f"{keepalive.url}/drop/post-once"]}).shared["post"]
    assert out["error_count"] == 1
    assert out["errors"][0]["error"].startswith("http: POST http://127.0.0.1:")
    assert KeepAlive.served["post-once"] == 1
