"""`http`: one HTTP request with the stdlib's urllib (no extra dependency on workers).

A response is data: any status is written to the store, and a non-2xx one also sets `error` and
returns the `error` action. Not getting a response (refused, reset, timed out) raises, so the node's
retries apply; the URL in that message has its credentials and secret query values masked
(worker/redact.py). Only http:// and https:// URLs are allowed: a templated URL must not read local files.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from pocketflow import Node

from worker import redact
from worker.nodes.params import param
from worker.nodes.registry import register

JSON_TYPE_RE = re.compile(r"^application/(.+\+)?json$")
METHOD_RE = re.compile(r"^[A-Z]+$")
URL_WHAT, METHOD_WHAT = "an http:// or https:// URL", "an HTTP method like GET or POST"
TIMEOUT_WHAT = "a positive number of seconds"


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


def build_request(params: dict[str, Any]) -> tuple[urllib.request.Request, float]:
    """Validate the params and turn them into a urllib Request plus the timeout."""
    url = param("http", params, "url", str, required=True, empty_is_missing=True, what=URL_WHAT, check=_web_url)
    method = param("http", params, "method", str, default="GET", empty_is_missing=True, what=METHOD_WHAT, check=_method)
    timeout = param("http", params, "timeout", (int, float), default=30, what=TIMEOUT_WHAT, check=lambda t: t > 0)
    query = [
        (str(k), _scalar("params", v))
        for k, value in param("http", params, "params", dict, default={}).items()
        for v in (value if isinstance(value, list) else [value])
        if v is not None
    ]
    if query:
        url += ("&" if urllib.parse.urlsplit(url).query else ("" if url.endswith("?") else "?")) + (
            urllib.parse.urlencode(query)
        )
    headers = {str(k): _scalar("headers", v) for k, v in param("http", params, "headers", dict, default={}).items()}
    data = None
    if params.get("json") is not None and params.get("body") is not None:
        raise ValueError("http: params 'json' and 'body' are exclusive; give one")
    if params.get("json") is not None:
        data = json.dumps(params["json"]).encode("utf-8")
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    elif params.get("body") is not None:
        data = param("http", params, "body", str).encode("utf-8")
    return urllib.request.Request(url, data=data, headers=headers, method=method.upper()), timeout


def read_response(response: Any, status: int, reason: str) -> dict[str, Any]:
    """status, headers (lower-case names; repeats joined by ', '), and `json` or `body`."""
    raw = response.read()
    headers: dict[str, str] = {}
    for name, value in response.headers.items():
        key = name.lower()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    try:
        text = raw.decode(response.headers.get_content_charset() or "utf-8", errors="replace")
    except LookupError:
        text = raw.decode("utf-8", errors="replace")
    result: dict[str, Any] = {"status": status, "reason": reason, "headers": headers}
    if JSON_TYPE_RE.match(response.headers.get_content_type()) and text.strip():
        try:
            result["json"] = json.loads(text)
            return result
        except ValueError:
            pass  # says JSON, isn't: keep the text
    result["body"] = text
    return result


@register("http")
class HttpNode(Node):
    """Sends a request; non-2xx is the `error` action, no response at all raises (retryable)."""

    PARAMS = {
        "url": "(required) http:// or https:// URL",
        "method": "HTTP method (default GET)",
        "headers": "dict of request headers",
        "params": "dict of query-string parameters (a list value repeats the key)",
        "json": "any value, sent as a JSON body with Content-Type application/json",
        "body": "string body, sent as UTF-8 (exclusive with json)",
        "timeout": "seconds to wait for the server (default 30); exceeding it raises TimeoutError",
    }

    def prep(self, shared: Any) -> tuple[urllib.request.Request, float]:
        return build_request(self.params)

    def exec(self, prep_res: tuple[urllib.request.Request, float]) -> dict[str, Any]:
        request, timeout = prep_res
        where = f"http: {request.get_method()} {redact.mask_url(request.full_url)}"  # never the token in a query
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return read_response(response, response.status, response.reason)
        except urllib.error.HTTPError as exc:  # a real response with a non-2xx status
            with exc:
                return read_response(exc, exc.code, exc.reason)
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise TimeoutError(f"{where} timed out after {timeout}s") from exc
            raise ConnectionError(f"{where} failed: {exc.reason}") from exc
        except TimeoutError as exc:
            raise TimeoutError(f"{where} timed out after {timeout}s") from exc

    def post(self, shared: Any, prep_res: Any, exec_res: dict[str, Any]) -> str:
        reason = exec_res.pop("reason")
        for key, value in exec_res.items():
            shared[key] = value
        if 200 <= exec_res["status"] < 300:
            return "default"
        shared["error"] = f"HTTP {exec_res['status']} {reason}".rstrip()
        return "error"
