"""`http`: one HTTP request through this process's pooled httpx client (keep-alive, shared by every item).

A response is data: any status is written to the store, and a non-2xx one also sets `error` and
returns the `error` action. Not getting a response (refused, reset, timed out) raises, so the node's
retries apply; the URL in that message has its credentials and secret query values masked
(worker/redact.py). Only http:// and https:// URLs are allowed: a templated URL must not read local files.
A batch's stop (cancel, fail_fast, a threshold) ends a call in flight within a second, its connection closed,
and keeps one not yet sent from going (worker/nodes/stoppable.py): the item has no outcome.

Backpressure: a 429, or a 503 with Retry-After, raises `Throttled` (never a response the node writes): the
engine waits what the server asked and calls again without counting an attempt (worker/engine/rate_limits.py).
"""

from __future__ import annotations

import email.utils
import json
import math
import os
import re
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, NamedTuple

from pocketflow import Node

from ir.errors import Throttled
from worker import redact, settings, tracing
from worker.engine.rate_limits import DEFAULT_MAX_WAIT
from worker.nodes.params import Param
from worker.nodes.registry import register

if TYPE_CHECKING:
    import httpx

JSON_TYPE_RE = re.compile(r"^application/(.+\+)?json$")
METHOD_RE = re.compile(r"^[A-Z]+$")
URL_WHAT, METHOD_WHAT = "an http:// or https:// URL", "an HTTP method like GET or POST"
TIMEOUT_WHAT = "a positive number of seconds"
#: Methods that mean the same sent twice (RFC 9110): sent once more when their connection broke under them.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
#: Seconds an idle pooled connection is kept before it is closed.
KEEPALIVE_SECONDS = 30.0

_client: httpx.Client | None = None
_client_pid = 0
_client_lock = threading.Lock()


def _forget_client() -> None:
    """In a forked child: the parent's client (its sockets, its pool's locks) is never touched again."""
    global _client, _client_lock
    _client, _client_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_client)


def client() -> httpx.Client:
    """This process's pooled client, made on first use (httpx is imported then: the CLI starts faster).

    A forked child (a prefork worker) makes its own: sockets shared with the parent would mix two
    processes' requests on one connection."""
    global _client, _client_pid
    pid = os.getpid()
    if _client is None or _client_pid != pid:
        with _client_lock:
            if _client is None or _client_pid != pid:
                import httpx

                # A few kept-alive connections serve many threads: a rate-limited API needs rate x latency
                # requests in flight, not one per thread; a call past the cap waits for a free connection.
                connections = settings.get("http_connections")
                limits = httpx.Limits(
                    max_connections=connections,
                    max_keepalive_connections=connections,
                    keepalive_expiry=KEEPALIVE_SECONDS,
                )
                from worker.nodes.stoppable import transport

                # the batch's stop ends a response waited for (worker/nodes/stoppable.py)
                made = httpx.Client(transport=transport(limits), limits=limits, follow_redirects=True)
                _client, _client_pid = made, pid
    return _client


class Call(NamedTuple):
    """One validated request (what prep hands to exec)."""

    method: str
    url: str
    headers: dict[str, str]
    content: bytes | None
    timeout: float
    max_wait: float


def _web_url(url: str) -> bool:
    return urllib.parse.urlsplit(url).scheme.lower() in ("http", "https")


def _method(method: str) -> bool:
    return METHOD_RE.match(method.upper()) is not None


def _scalar(node_param: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError(f"http: param '{node_param}' values must be strings or numbers, got {type(value).__name__}")


#: The http node's params (worker/nodes/params.py): shown by `chordflow nodes`, checked by validation and in prep.
PARAMS = {
    "url": Param(
        "(required) http:// or https:// URL", str, required=True, empty_is_missing=True, what=URL_WHAT, check=_web_url
    ),
    "method": Param(
        "HTTP method (default GET)", str, default="GET", empty_is_missing=True, what=METHOD_WHAT, check=_method
    ),
    "headers": Param("dict of request headers", dict, default={}),
    "params": Param("dict of query-string parameters (a list value repeats the key)", dict, default={}),
    "json": Param("any value, sent as a JSON body with Content-Type application/json"),
    "body": Param(
        "string body, sent as UTF-8 (exclusive with json; Content-Type application/x-www-form-urlencoded unless a "
        "header gives one)",
        str,
    ),
    "timeout": Param(
        "seconds to wait for the server (default 30); exceeding it raises TimeoutError",
        (int, float), default=30, what=TIMEOUT_WHAT, check=lambda t: t > 0,
    ),
    "max_throttle_wait": Param(
        "seconds (number > 0, default 300) this call may spend in all waiting out 429s and 503s with Retry-After "
        "before its item fails",
        (int, float), default=DEFAULT_MAX_WAIT, what=TIMEOUT_WHAT, check=lambda t: t > 0,
    ),
}  # fmt: skip
_CALL_PARAMS = ("url", "method", "timeout", "max_throttle_wait")


def build_request(params: dict[str, Any]) -> Call:
    """Validate the params and turn them into one Call."""
    url, method, timeout, max_wait = (PARAMS[name].get("http", params, name) for name in _CALL_PARAMS)
    query = [
        (str(k), _scalar("params", v))
        for k, value in PARAMS["params"].get("http", params, "params").items()
        for v in (value if isinstance(value, list) else [value])
        if v is not None
    ]
    if query:
        url += ("&" if urllib.parse.urlsplit(url).query else ("" if url.endswith("?") else "?")) + (
            urllib.parse.urlencode(query)
        )
    headers = {str(k): _scalar("headers", v) for k, v in PARAMS["headers"].get("http", params, "headers").items()}
    data = None
    if params.get("json") is not None and params.get("body") is not None:
        raise ValueError("http: params 'json' and 'body' are exclusive; give one")
    if params.get("json") is not None:
        data = json.dumps(params["json"]).encode("utf-8")
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    elif params.get("body") is not None:
        data = PARAMS["body"].get("http", params, "body").encode("utf-8")
        if not any(k.lower() == "content-type" for k in headers):  # what urllib sent: kept for servers relying on it
            headers["Content-Type"] = "application/x-www-form-urlencoded"
    return Call(method.upper(), url, headers, data, float(timeout), float(max_wait))


def parse_retry_after(value: Any, now: float | None = None) -> float | None:
    """Seconds a Retry-After value asks for: delta-seconds (a fraction too) or an HTTP-date (a past one is 0).
    None when absent or unparsable: the engine then backs off on its own."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value >= 0 else None
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT
            return None
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _content_type(headers: httpx.Headers) -> str:
    """The media type, lower-case; text/plain when missing or malformed (as the stdlib's email parser says)."""
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return media if media.count("/") == 1 else "text/plain"


def read_response(response: httpx.Response) -> dict[str, Any]:
    """status, reason, headers (lower-case names; repeats joined by ', '), and `json` or `body`."""
    headers: dict[str, str] = {}
    for name, value in response.headers.multi_items():
        key = name.lower()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    raw = response.content
    try:
        text = raw.decode(response.charset_encoding or "utf-8", errors="replace")
    except LookupError:
        text = raw.decode("utf-8", errors="replace")
    result: dict[str, Any] = {"status": response.status_code, "reason": response.reason_phrase, "headers": headers}
    if JSON_TYPE_RE.match(_content_type(response.headers)) and text.strip():
        try:
            result["json"] = json.loads(text)
            return result
        except ValueError:
            pass  # says JSON, isn't: keep the text
    result["body"] = text
    return result


def send(call: Call) -> httpx.Response:
    """The response to `call` (its body read, the connection back in the pool); raises TimeoutError,
    ConnectionError (no response: retryable) or ValueError (a request that cannot be sent).

    An idempotent request whose connection broke under it (closed, reset, a closed socket: the server or the
    pool dropped a kept-alive connection, which httpcore's pool can do under many threads) is sent once more on a
    fresh connection, as browsers and urllib3 do; any other request is not: it may have reached the server."""
    import httpx

    where = f"http: {call.method} {redact.mask_url(call.url)}"  # never the token in a query
    # Waiting for a pooled connection is not the call timing out: only the request's own time counts.
    timeout = httpx.Timeout(call.timeout, pool=None)
    asked = {"http.request.method": call.method, "url.full": redact.mask_url(call.url)} if tracing.ON else None
    try:
        with tracing.span(call.method, asked, kind="client") as current:
            headers = {**call.headers, **tracing.headers()}  # the server may join the run's trace
            try:
                response = client().request(call.method, call.url, headers=headers, content=call.content,
                                            timeout=timeout)  # fmt: skip
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.CloseError):
                if call.method not in IDEMPOTENT:
                    raise
                response = client().request(call.method, call.url, headers=headers, content=call.content,
                                            timeout=timeout)  # fmt: skip
            if current is not None:
                current.set_attribute("http.response.status_code", response.status_code)
            return response
    except httpx.TimeoutException as exc:
        raise TimeoutError(f"{where} timed out after {call.timeout:g}s") from exc
    except (httpx.InvalidURL, httpx.UnsupportedProtocol, httpx.LocalProtocolError) as exc:
        raise ValueError(f"{where} cannot be sent: {redact.mask(str(exc))}") from exc
    except httpx.HTTPError as exc:  # refused, reset, closed early, too many redirects
        raise ConnectionError(f"{where} failed: {redact.mask(str(exc))}") from exc


@register("http")
class HttpNode(Node):
    """Sends a request; non-2xx is the `error` action, no response at all raises (retryable), and a 429 (or a
    503 with Retry-After) raises Throttled so the engine waits and asks again."""

    PARAMS = PARAMS

    def prep(self, shared: Any) -> Call:
        call = build_request(self.params)
        client()  # made (httpx imported) before the call is admitted: admitted calls must not queue up behind it
        return call

    def exec(self, prep_res: Call) -> dict[str, Any]:
        response = send(prep_res)
        retry_after = response.headers.get("retry-after")
        if response.status_code == 429 or (response.status_code == 503 and retry_after is not None):
            raise Throttled(
                f"HTTP {response.status_code} from {redact.mask_url(prep_res.url)}",
                retry_after=parse_retry_after(retry_after),
                max_wait=prep_res.max_wait,
            )
        return read_response(response)

    def post(self, shared: Any, prep_res: Any, exec_res: dict[str, Any]) -> str:
        reason = exec_res.pop("reason")
        for key, value in exec_res.items():
            shared[key] = value
        if 200 <= exec_res["status"] < 300:
            return "default"
        shared["error"] = f"HTTP {exec_res['status']} {reason}".rstrip()
        return "error"
