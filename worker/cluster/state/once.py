"""A Lua script that runs once per call, however many times the call is sent.

Every chordflow client sends a command again when its connection drops (worker/cluster/outage.py). If the drop
came after Redis ran the command — Redis stopped with SIGTERM flushes its AOF but not its replies; a network cut
loses the reply in flight — the command runs twice. For a script that counts (a budget's spend), moves state on (a
checkpoint, which would then find its own step taken and stop the run) or hands out work in its reply (the chunks a
batch window or a dataset step claims, which nobody sends if the reply is lost), twice is wrong.

So such a script is wrapped: each call carries a fresh key (keys.py `once_key`, under the hash tag of the script's
first key, so it shares their Redis Cluster slot); the script stores its reply there for as long as a retry may come
(the outage budget, and MARGIN), and a call that finds it returns it without running again. A retry sends the same
key, so it gets the first run's reply. Nothing is stored for a purged run (its tombstone, keys.py `purged_key`, is
there): its scripts refuse and write nothing, and so does the wrapper.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import redis

from worker import settings
from worker.cluster.state.keys import once_key, purged_key
from worker.cluster.state.runstate import script_source

#: Seconds a reply is kept past the outage budget (CHORDFLOW_OUTAGE_SECONDS): no retry is sent after that budget.
MARGIN = 30
#: The wrapper: the call's key and the run's tombstone are the last KEYS entries, taken off before the script's own
#: body reads KEYS.
WRAPPER = """local once = table.remove(KEYS)
local tombstone = table.remove(KEYS)
local seen = redis.call('GET', once)
if seen then return cjson.decode(seen) end
local reply = (function()
%s
end)()
if reply == nil then reply = false end
if redis.call('EXISTS', tombstone) == 0 then
  redis.call('SET', once, cjson.encode(reply), 'EX', %d)
end
return reply
"""
TAG = re.compile(r"\{([^}]+)\}")


class Once:
    """A registered Lua script of worker/cluster/state/lua/ called like redis-py's Script (keys, args, client)."""

    def __init__(self, redis_client: redis.Redis, name: str):
        seconds = settings.load().outage_seconds + MARGIN
        self.script = redis_client.register_script(WRAPPER % (script_source(name), seconds))

    def __call__(self, keys: list[Any], args: list[Any], client: Any = None) -> Any:
        first = keys[0].decode() if isinstance(keys[0], bytes) else str(keys[0])
        found = TAG.search(first)
        tag = found.group(1) if found else first
        return self.script(keys=[*keys, purged_key(tag), once_key(tag, uuid.uuid4().hex)], args=args, client=client)


def once(redis_client: redis.Redis, name: str) -> Once:
    """The script `name`, run once per call (see the module's docstring)."""
    return Once(redis_client, name)
