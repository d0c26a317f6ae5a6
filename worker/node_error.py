"""NodeError: "error as state" on top of pocketflow 0.0.3, which lacks it.

A dict subclass so it travels through msgpack as a plain map and reads naturally in templates
(`${_error.message}`), while Python code can use attributes (`err.exception_type`). The original
exception object is kept as `.exception` in-process only.
"""

from __future__ import annotations

import time
import traceback
from typing import Any


class NodeError(dict):
    FIELDS = ("exception_type", "message", "node_name", "retry_count", "max_retries", "traceback_str", "timestamp")

    exception: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @classmethod
    def from_exception(cls, exc: BaseException, node_name: str, retry_count: int, max_retries: int) -> NodeError:
        error = cls(
            exception_type=type(exc).__name__,
            message=str(exc),
            node_name=node_name,
            retry_count=retry_count,
            max_retries=max_retries,
            traceback_str="".join(traceback.format_exception(exc)),
            timestamp=time.time(),
        )
        error.exception = exc
        return error
