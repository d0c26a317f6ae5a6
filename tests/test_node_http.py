"""The `http` node against a real local ThreadingHTTPServer started per test module."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

import scheduler
from tests.support import http_server
from worker.nodes.http import HttpNode
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
