"""`read-file` and `write-file`: text files on the worker's filesystem.

Both write the absolute `path` they used, so later nodes (possibly on other workers) get an
unambiguous location. write-file replaces a file atomically (temp file in the same directory, then
os.replace) so a reader or a killed worker never leaves a half-written file behind.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import stat
import uuid
from typing import Any

from pocketflow import Node

from worker.nodes.params import Param
from worker.nodes.registry import register


def _path_param(doc: str) -> Param:
    return Param(doc, (str, os.PathLike), required=True, empty_is_missing=True, what="a string")


#: The params of both node types (worker/nodes/params.py): shown by `chordflow nodes`, checked by validation.
ENCODING = Param("text encoding (default utf-8)", str, default="utf-8")
READ_PARAMS = {"path": _path_param("(required) file to read; written back as an absolute `path`"), "encoding": ENCODING}
WRITE_PARAMS = {
    "path": _path_param("(required) file to write; written back as an absolute `path`"),
    "content": Param("(required) text to write; any other value is written as JSON", object, required=True),
    "append": Param("bool: append instead of replacing the file atomically (default false)", bool, default=False),
    "encoding": ENCODING,
}


def _path(node_type: str, params: dict[str, Any]) -> str:
    return os.path.abspath(os.fspath(READ_PARAMS["path"].get(node_type, params, "path")))


def _encoding(node_type: str, params: dict[str, Any]) -> str:
    encoding = ENCODING.get(node_type, params, "encoding")
    try:
        return codecs.lookup(encoding).name
    except LookupError:
        raise ValueError(f"{node_type}: param 'encoding' is not a known encoding: {encoding!r}") from None


def atomic_write(path: str, data: bytes) -> None:
    """Write `data` to a sibling temp file, fsync it, then rename it over `path`."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))  # keep an existing file's mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@register("read-file")
class ReadFileNode(Node):
    """Reads a text file into `content`; a missing file raises FileNotFoundError (retryable)."""

    PARAMS = READ_PARAMS

    def prep(self, shared: Any) -> tuple[str, str]:
        return _path("read-file", self.params), _encoding("read-file", self.params)

    def exec(self, prep_res: tuple[str, str]) -> dict[str, str]:
        path, encoding = prep_res
        try:
            with open(path, encoding=encoding, newline="") as handle:
                return {"content": handle.read(), "path": path}
        except FileNotFoundError:
            raise FileNotFoundError(f"read-file: no such file: {path}") from None

    def post(self, shared: Any, prep_res: Any, exec_res: dict[str, str]) -> str:
        shared["content"], shared["path"] = exec_res["content"], exec_res["path"]
        return "default"


@register("write-file")
class WriteFileNode(Node):
    """Writes `content` (non-strings as JSON) to a file, creating parent directories."""

    PARAMS = WRITE_PARAMS

    def prep(self, shared: Any) -> tuple[str, bytes, bool]:
        path, encoding = _path("write-file", self.params), _encoding("write-file", self.params)
        content, append = (WRITE_PARAMS[name].get("write-file", self.params, name) for name in ("content", "append"))
        text = content if isinstance(content, str) else json.dumps(content, indent=2, ensure_ascii=False)
        try:
            return path, text.encode(encoding), append
        except UnicodeEncodeError as exc:
            raise ValueError(f"write-file: param 'content' cannot be encoded as {encoding}: {exc}") from None

    def exec(self, prep_res: tuple[str, bytes, bool]) -> dict[str, Any]:
        path, data, append = prep_res
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if append:
            with open(path, "ab") as handle:
                handle.write(data)
        else:
            atomic_write(path, data)
        return {"path": path, "bytes": len(data)}

    def post(self, shared: Any, prep_res: Any, exec_res: dict[str, Any]) -> str:
        shared["path"], shared["bytes"] = exec_res["path"], exec_res["bytes"]
        return "default"
