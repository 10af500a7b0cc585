"""ldp_core.days: the one way UTC days, their starts and their ISO names are computed."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from ldp_core.days import DAY_SECONDS, EPOCH, day_of_iso, day_start, iso_day, parse_day, utc_day, utc_iso_day

# 2025-11-27 23:59:59.5 UTC and the next midnight
LATE = dt.datetime(2025, 11, 27, 23, 59, 59, 500000, tzinfo=dt.UTC).timestamp()


def test_day_numbers_agree_with_the_calendar() -> None:
    assert EPOCH == dt.date(1970, 1, 1) and DAY_SECONDS == 86400
    day = (dt.date(2025, 11, 27) - EPOCH).days
    assert utc_day(LATE) == day and utc_day(LATE + 0.5) == day + 1
    assert utc_day(0.0) == 0 and utc_day(-0.5) == -1
    assert day_start(LATE) == day * DAY_SECONDS and day_start(LATE + 0.5) == (day + 1) * DAY_SECONDS


def test_iso_names_round_trip_and_match_the_gmtime_form() -> None:
    assert iso_day(0) == "1970-01-01" and day_of_iso("1970-01-01") == 0
    for t in (LATE, LATE + 0.5, 1e9, time.time()):
        assert utc_iso_day(t) == time.strftime("%Y-%m-%d", time.gmtime(t)) == iso_day(utc_day(t))
        assert day_of_iso(utc_iso_day(t)) == utc_day(t)
    with pytest.raises(ValueError):
        day_of_iso("27/11/2025")


def test_parse_day_takes_numbers_and_iso_dates() -> None:
    assert parse_day(20419) == parse_day("20419") == parse_day(" 20419 ") == 20419
    assert parse_day("2025-11-27") == day_of_iso("2025-11-27")
    with pytest.raises(ValueError, match="neither a day number"):
        parse_day("monday")
