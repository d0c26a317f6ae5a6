"""Which fires a schedule's sweep makes (worker/cluster/schedules.py `due_fires`), in-process: every fire of the last
few seconds always, the older ones (missed while no worker swept) as its catchup says — none, the latest, each up to
100 —; cron read in the schedule's timezone across both DST changes (a time of day that comes twice fires once, a
skipped one fires when the clocks jump), 6 fields with seconds first, and bad expressions as one line naming `cron`
or `timezone`."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from ir.errors import ValidationError
from worker.cluster.schedules import GRACE_SECONDS, MAX_CATCHUP, Cron, due_fires

UTC = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")


def at(*parts: int, zone: ZoneInfo = UTC, fold: int = 0) -> int:
    return int(datetime(*parts, tzinfo=zone, fold=fold).timestamp())  # type: ignore[misc]


def shown(fires: list[int], zone: ZoneInfo = UTC) -> list[str]:
    return [datetime.fromtimestamp(fire, zone).isoformat() for fire in fires]


T = at(2026, 3, 2, 9, 0)  # a minute's first second
EVERY_MINUTE = Cron("* * * * *")


def test_a_fire_due_now_is_made_whatever_the_catchup() -> None:
    for catchup in ("none", "last", "all"):
        due = due_fires(EVERY_MINUTE, catchup, T, T + 0.4)
        assert (due.fires, due.skipped, due.capped) == ([T], False, False), catchup


def test_nothing_is_due_before_the_next_fire_time() -> None:
    assert due_fires(EVERY_MINUTE, "all", T, T - 0.1).fires == []
    assert due_fires(EVERY_MINUTE, "all", T + 60, T + 59.9).fires == []


@pytest.mark.parametrize(
    ("catchup", "expected", "skipped"),
    [
        ("all", [T + 60 * i for i in range(6)], False),
        ("last", [T + 300], True),
        ("none", [], True),
    ],
)
def test_fires_missed_while_no_worker_swept_follow_the_catchup(
    catchup: str, expected: list[int], skipped: bool
) -> None:
    now = T + 330  # fires at T, T+60 ... T+300 were missed; the latest is 30 s old
    due = due_fires(EVERY_MINUTE, catchup, T, now)
    assert (due.fires, due.skipped, due.capped) == (expected, skipped, False)


@pytest.mark.parametrize(
    ("catchup", "expected"),
    [("all", [T + 60 * i for i in range(6)]), ("last", [T + 300]), ("none", [T + 300])],
)
def test_a_recent_fire_after_missed_ones_stands_for_them_under_last_and_is_made_under_none(
    catchup: str, expected: list[int]
) -> None:
    now = T + 300 + GRACE_SECONDS - 1  # the latest fire is within the grace: due now
    assert due_fires(EVERY_MINUTE, catchup, T, now).fires == expected


def test_catchup_all_makes_the_latest_100_missed_fires_and_says_it_capped() -> None:
    every_second = Cron("* * * * * *")
    due = due_fires(every_second, "all", T, T + 1000)
    assert due.fires == list(range(T + 1000 - MAX_CATCHUP + 1, T + 1001)) and due.capped
    assert not due_fires(every_second, "all", T, T + MAX_CATCHUP - 1).capped  # exactly 100: all of them


def test_six_fields_take_seconds_first() -> None:
    every_10_s = Cron("*/10 * * * * *")
    assert every_10_s.seconds
    assert every_10_s.after(T) == T + 10 and every_10_s.after(T + 9.99) == T + 10
    assert due_fires(every_10_s, "all", T, T + 25).fires == [T, T + 10, T + 20]
    assert Cron("15 30 9 * * *").after(T) == T + 30 * 60 + 15  # second 15 of 09:30


def test_keywords_read_as_their_fields() -> None:
    assert Cron("@hourly").after(T) == T + 3600
    assert Cron("@daily", "Europe/Berlin").after(T) == at(2026, 3, 3, 0, 0, zone=BERLIN)


def test_cron_is_read_in_the_schedules_timezone() -> None:
    two_am = Cron("0 2 * * *", "America/New_York")
    assert shown([two_am.after(T)], ZoneInfo("America/New_York")) == ["2026-03-03T02:00:00-05:00"]


def test_a_time_of_day_the_clocks_skip_fires_when_they_jump() -> None:
    daily = Cron("30 2 * * *", "Europe/Berlin")  # 2024-03-31: 02:00 -> 03:00 in Berlin
    first = at(2024, 3, 30, 2, 30, zone=BERLIN)
    fires = due_fires(daily, "all", first, at(2024, 4, 1, 12, 0, zone=BERLIN)).fires
    assert shown(fires, BERLIN) == [
        "2024-03-30T02:30:00+01:00",
        "2024-03-31T03:00:00+02:00",
        "2024-04-01T02:30:00+02:00",
    ]


def test_a_time_of_day_that_comes_twice_fires_once_when_the_clocks_go_back() -> None:
    daily = Cron("30 2 * * *", "Europe/Berlin")  # 2024-10-27: 03:00 -> 02:00 in Berlin, 02:30 comes twice
    first = at(2024, 10, 26, 2, 30, zone=BERLIN)
    fires = due_fires(daily, "all", first, at(2024, 10, 28, 12, 0, zone=BERLIN)).fires
    assert shown(fires, BERLIN) == [
        "2024-10-26T02:30:00+02:00",
        "2024-10-27T02:30:00+02:00",
        "2024-10-28T02:30:00+01:00",
    ]
    after_first = daily.after(at(2024, 10, 27, 2, 31, zone=BERLIN))  # the second 02:30 is not the next fire
    assert shown([after_first], BERLIN) == ["2024-10-28T02:30:00+01:00"]


def test_a_schedule_with_a_star_in_its_hour_fires_by_the_clock_through_the_repeated_hour() -> None:
    half_hourly = Cron("*/30 * * * *", "Europe/Berlin")
    first = at(2024, 10, 27, 2, 0, zone=BERLIN)
    fires = due_fires(half_hourly, "all", first, at(2024, 10, 27, 3, 10, zone=BERLIN)).fires
    assert shown(fires, BERLIN) == [
        "2024-10-27T02:00:00+02:00",
        "2024-10-27T02:30:00+02:00",
        "2024-10-27T02:00:00+01:00",
        "2024-10-27T02:30:00+01:00",
        "2024-10-27T03:00:00+01:00",
    ]


@pytest.mark.parametrize(
    ("cron", "timezone", "said"),
    [
        ("61 * * * *", "UTC", "cron '61 * * * *': "),
        ("* * *", "UTC", "cron '* * *': 3 fields; expected 5 fields"),
        ("* * * * * * *", "UTC", "cron '* * * * * * *': 7 fields"),
        ("@reboot", "UTC", "cron '@reboot': an unknown keyword"),
        ("0 0 30 2 *", "UTC", "cron '0 0 30 2 *': never fires"),
        ("0 2 * * *", "Mars/Olympus", "timezone 'Mars/Olympus': unknown"),
        ("0 2 * * *", "../../etc/passwd", "timezone '../../etc/passwd': unknown"),
    ],
)
def test_a_bad_cron_or_timezone_is_one_line_naming_it(cron: str, timezone: str, said: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Cron(cron, timezone)
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)
