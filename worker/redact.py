"""Masking secrets in what chordflow shows or keeps about a failure: errors, events, log lines.

Diagnostics travel far — terminals, Flower, worker log files, Redis — and a token has no business
there. A secret is the value of a param, header, store key or query parameter whose name contains
`token`, `passw`, `secret`, `key`, `auth`, `cookie` or `credential` (any case), and the password of a
URL. `mask(text, secrets)` hides the given secret values (a failing node's, from `node_secrets`)
wherever they appear, even echoed inside a library's message, and the credentials of every URL and the
value of every secret-named `name=value` pair in the text, even where no value is known. Without
`secrets` (a log line, the CLI's one-line error) it hides the values this process `remember`ed from
its failed items instead.

Data the user gave the run (inputs, items, the store, the IR) is not a diagnostic and is not masked
there: a worker needs it. What is masked is its echo in error strings, a failed item's copy in
`errors`, and log records.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import urllib.parse
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ir.errors import RemoteError

#: What replaces a secret value.
MASK = "***"
#: What replaces a URL's password: kombu's spelling (`redis://:**@host`), as Celery's banner shows it.
URL_PASSWORD_MASK = "**"
#: Known values shorter than this are not searched for inside texts (masking every "ab" helps nobody);
#: they are still masked where their name or place says what they are (`api_token=ab`, `user:ab@`).
MIN_LENGTH = 4
#: How many secret values one process remembers for its log filter and its one-line errors.
REMEMBERED = 64

_NAMES = r"token|passw|secret|key|auth|cookie|credential"
SECRET_NAME = re.compile(_NAMES, re.IGNORECASE)
URL_RE = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")
# name=value, as in a query string, a form body or keyword arguments' repr (`api_token='abc'`).
PAIR_RE = re.compile(
    rf"(?<![\w.\-])([\w.\-\[\]]*?(?:{_NAMES})[\w.\-\[\]]*=)('[^']*'|\"[^\"]*\"|[^&;,#\s'\"<>)\]}}]+)",
    re.IGNORECASE,
)
# 'name': 'value' or "name": "value", as in a dict's repr or JSON.
QUOTED_RE = re.compile(
    rf"(['\"])([^'\"\n]*?(?:{_NAMES})[^'\"\n]*)\1(\s*[:=]\s*)(['\"])((?:\\.|(?!\4).)*)\4", re.IGNORECASE
)
# A header line: `Authorization: Bearer abc`, `Cookie: a=b`.
HEADER_RE = re.compile(
    r"(?<![\w\-])((?:proxy-)?authorization|(?:set-)?cookie|x-api-key|api-key)(\s*:\s*)"
    r"((?:(?:bearer|basic|token|digest)\s+)?[^\s,;'\"]+)",
    re.IGNORECASE,
)
_AUTH_SCHEME = re.compile(r"^(?:bearer|basic|token|digest)\s+(\S+)$", re.IGNORECASE)


def is_secret_name(name: Any) -> bool:
    """Whether a param, header, store key or query parameter of this name holds a secret."""
    return isinstance(name, str) and SECRET_NAME.search(name) is not None


# -- finding the secret values -------------------------------------------------------------------------


def secrets_in(value: Any, *, secret: bool = False, _depth: int = 0) -> set[str]:
    """The secret strings inside `value` (a node's resolved params): values under secret names, at any
    depth (`headers.Authorization`), and the passwords and secret query values of URLs in any string."""
    found: set[str] = set()
    if _depth > 32:
        return found
    if isinstance(value, str):
        if secret:
            found.add(value)
            scheme = _AUTH_SCHEME.match(value.strip())
            if scheme:
                found.add(scheme.group(1))
        found.update(_secrets_in_text(value))
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            found |= secrets_in(inner, secret=secret or is_secret_name(key), _depth=_depth + 1)
    elif isinstance(value, list | tuple):
        for inner in value:
            found |= secrets_in(inner, secret=secret, _depth=_depth + 1)
    return found


def _secrets_in_text(text: str) -> Iterable[str]:
    if "://" in text:
        for url in URL_RE.findall(text):
            password = _userinfo(url)[1]
            if password:
                yield password
    if "=" in text:
        for match in PAIR_RE.finditer(text):
            yield match.group(2).strip("'\"")


def node_secrets(node: Any, store: Mapping[str, Any] | None = None) -> frozenset[str]:
    """The secret values a failing node may echo: those of its resolved params (the innermost node of a
    wrapper chain holds them) and the store's secret-named values (`${api_token}` given as an input)."""
    while hasattr(node, "inner"):
        node = node.inner
    found = secrets_in(getattr(node, "params", None) or {})
    for key, value in (store or {}).items():
        if is_secret_name(key) and isinstance(value, str):
            found.add(value)
        elif isinstance(value, Mapping):  # one level down: `config.api_key`, a node's `token` output
            found.update(v for k, v in value.items() if is_secret_name(k) and isinstance(v, str))
    return frozenset(found)


# -- remembering them ------------------------------------------------------------------------------------

_remembered: OrderedDict[str, tuple[str, ...]] = OrderedDict()  # value -> the forms it is searched in
_lock = threading.Lock()


def remember(secrets: Iterable[str]) -> None:
    """Keep `secrets` for this process's later masks (log lines, one-line errors); the newest REMEMBERED."""
    with _lock:
        for value in secrets:
            if len(value) >= MIN_LENGTH:
                _remembered[value] = _forms(value)
                _remembered.move_to_end(value)
        while len(_remembered) > REMEMBERED:
            _remembered.popitem(last=False)


def forget() -> None:
    """Drop every remembered secret (tests)."""
    with _lock:
        _remembered.clear()


def _mask_remembered(text: str) -> str:
    # Substring tests, not one big regex: hundreds of values compile in tens of milliseconds, and the
    # set changes with every failed item that brings a new secret.
    with _lock:
        forms = tuple(_remembered.values())
    hits = [form for each in forms for form in each if form in text]
    for form in sorted(hits, key=len, reverse=True):
        text = text.replace(form, MASK)
    return text


# -- masking --------------------------------------------------------------------------------------------------


def mask(text: str, secrets: Collection[str] = ()) -> str:
    """`text` with URL credentials and secret-named values masked, and the values of `secrets` — or, when
    none are given (a log line, a one-line error), those this process remembered — wherever they appear."""
    if not text:
        return text
    if "://" in text:
        text = URL_RE.sub(lambda m: mask_url(m.group()), text)
    if SECRET_NAME.search(text):  # the name=value forms below all need a secret name
        if "=" in text:
            text = PAIR_RE.sub(_masked_pair, text)
        if ":" in text:
            text = QUOTED_RE.sub(lambda m: f"{m[1]}{m[2]}{m[1]}{m[3]}{m[4]}{MASK}{m[4]}", text)
            text = HEADER_RE.sub(lambda m: f"{m[1]}{m[2]}{MASK}", text)
    if not secrets:
        return _mask_remembered(text)
    pattern = _values_pattern(frozenset(secrets))
    return pattern.sub(MASK, text) if pattern is not None else text


#: Values that are placeholders in chordflow's own usage messages (`expected KEY=VALUE`), not secrets.
PLACEHOLDERS = frozenset({"VALUE", "..."})


def _masked_pair(match: re.Match[str]) -> str:
    value = match.group(2)
    if value in PLACEHOLDERS:
        return match.group(0)
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{match.group(1)}{quote}{MASK}{quote}"


@functools.lru_cache(maxsize=64)
def _values_pattern(values: frozenset[str]) -> re.Pattern[str] | None:
    forms = {form for value in values if len(value) >= MIN_LENGTH for form in _forms(value)}
    if not forms:
        return None
    return re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))


def _forms(value: str) -> tuple[str, ...]:
    """A secret as it may appear: as is, and percent-encoded as in a URL or a form body."""
    return tuple(dict.fromkeys((value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value))))


def mask_url(url: str) -> str:
    """`url` with its password (`redis://:**@host:6379/0`; an `@` inside the password included: the user
    part ends at the LAST `@` before the path's query) and its secret-named query values masked. A
    user without a password is masked whole (`https://TOKEN@host`): it is often a token."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return PAIR_RE.sub(_masked_pair, url)
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    head, tail = rest[:cut], rest[cut:]
    user, password, host = _split_userinfo(head)
    if host is not None:
        head = f"{user}:{URL_PASSWORD_MASK}@{host}" if password is not None else f"{MASK}@{host}"
    if "://" in tail:  # a URL inside the query (`?next=https://u:p@h/`)
        tail = URL_RE.sub(lambda m: mask_url(m.group()), tail)
    return f"{scheme}://{head}{PAIR_RE.sub(_masked_pair, tail)}"


def _split_userinfo(head: str) -> tuple[str, str | None, str | None]:
    """(user, password, rest after the `@`), or host None when `head` (netloc + path) has no userinfo."""
    at = head.rfind("@")
    if at < 0:
        return "", None, None
    userinfo, host = head[:at], head[at + 1 :]
    user, colon, password = userinfo.partition(":")
    if "/" in user:  # the `@` is in the path (`http://h/users/@me`), not after a userinfo
        return "", None, None
    return user, (password if colon else None), host


def _userinfo(url: str) -> tuple[str, str | None]:
    rest = url.partition("://")[2]
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    user, password, host = _split_userinfo(rest[:cut])
    return (user, password) if host is not None else ("", None)


def mask_value(value: Any, secrets: Collection[str] = (), _depth: int = 0) -> Any:
    """A copy of `value` (a failed item, an error entry) with its secret-named entries and the secrets in
    its strings masked."""
    if isinstance(value, str):
        return mask(value, secrets)
    if _depth > 32:
        return value
    if isinstance(value, Mapping):
        return {
            k: MASK if is_secret_name(k) and isinstance(v, str) else mask_value(v, secrets, _depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [mask_value(v, secrets, _depth + 1) for v in value]
    if type(value) is tuple:
        return tuple(mask_value(v, secrets, _depth + 1) for v in value)
    return value


def scrub_exception(exc: BaseException, secrets: Collection[str] = ()) -> BaseException:
    """`exc` with its message (and those of its causes) masked in place, keeping its type and traceback.

    An exception whose text does not come from its args (a custom `__str__`) cannot be fixed in place:
    then a new one of its type with the masked message is returned (or a RemoteError naming the type when
    the type takes other arguments), with the traceback and without the unmasked causes.
    """
    for each in _chain(exc):
        _scrub_in_place(each, secrets)
    text = str(exc)
    masked = mask(text, secrets)
    if masked == text:
        return exc
    kind = type(exc)
    try:
        fresh: BaseException = kind(masked)
        if str(fresh) != masked:
            raise TypeError(kind.__name__)
    except Exception:
        name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
        fresh = RemoteError(name, masked)
    fresh.__suppress_context__ = True
    return fresh.with_traceback(exc.__traceback__)


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    todo = [exc]
    while todo:
        each = todo.pop()
        if each is None or id(each) in seen:
            continue
        seen.add(id(each))
        yield each
        todo += [each.__cause__, each.__context__]  # type: ignore[list-item]


def _scrub_in_place(exc: BaseException, secrets: Collection[str]) -> None:
    try:
        exc.args = tuple(mask(a, secrets) if isinstance(a, str) else a for a in exc.args)
        attributes = dict(getattr(exc, "__dict__", {}))
        if isinstance(exc, OSError):
            attributes.update(strerror=exc.strerror, filename=exc.filename, filename2=exc.filename2)
        for name, value in attributes.items():
            if isinstance(value, str):
                setattr(exc, name, mask(value, secrets))
    except Exception:  # a read-only attribute: scrub_exception then replaces the exception
        pass


# -- worker logs ------------------------------------------------------------------------------------------


class LogFilter(logging.Filter):
    """Masks each record's message and traceback text (URL credentials, secret-named values, remembered
    secrets) before a handler writes it. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose args do not fit its format: leave it to the handler
            return True
        masked = mask(message)
        if masked != message:
            record.msg, record.args = masked, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask(record.exc_text)
        return True


def install_log_filter(logger: logging.Logger | None = None, **_: Any) -> None:
    """Put a LogFilter on every handler of `logger`, of the root logger and of Celery's task logger
    (once per handler).

    A receiver for Celery's `after_setup_task_logger` signal: Celery sends it once the root logger and
    then the task logger have their handlers, in the worker and in each pool process it starts.
    """
    for each in {logger or logging.getLogger(), logging.getLogger(), logging.getLogger("celery.task")}:
        for handler in each.handlers:
            if not any(isinstance(f, LogFilter) for f in handler.filters):
                handler.addFilter(LogFilter())
