"""Durations as people write them: `90s`, `30m`, `12h`, `7d` (a whole number and one unit)."""

from __future__ import annotations

import re

#: Seconds in each unit.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: What a duration looks like, for messages.
EXAMPLES = "like 7d, 12h, 30m or 90s"


def seconds(text: str) -> int | None:
    """The seconds `text` stands for, or None when it is not a duration."""
    found = re.fullmatch(r"(\d+)([smhd])", text.strip())
    return None if found is None else int(found.group(1)) * UNITS[found.group(2)]
