"""A wall clock moved forward must not open fresh daily budgets (issue #28).

The adversary is whoever can set the device's clock (the user, a malicious app
with the permission, a spoofed NTP answer): five jumps of a day within one real
day would give six daily caps. The real :class:`TelemetryClient` runs with an
injected wall clock *and* an injected monotonic clock; the ledger may advance
its days only as fast as monotonic time passes within one boot.
"""

from __future__ import annotations

from client_sdk.client import TelemetryClient
from client_sdk.config import ClientConfig
from client_sdk.policy import LocalPolicy
from ldp_core.metrics import FORMAT

DAY = 86400.0
HOUR = 3600.0
START = 20_600 * DAY + 60.0  # one minute into a UTC day
CAP = 2.0
POLICY = LocalPolicy(per_metric_daily=CAP, total_daily=CAP)
DOC = {
    "format": FORMAT,
    "metrics": {
        "color": {
            "description": "clock jump test",
            "owner": "sdk-tests@example.org",
            "expires": "2099-12-31",
            "mechanism": {"mechanism": "grr", "epsilon": 1.0},
            "domain": {"kind": "dictionary", "values": ["red", "green", "blue"], "other": True},
            "max_reports_per_day": 2,
        }
    },
}


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def client(tmp_path, wall: Clock, mono: Clock, boot: str) -> TelemetryClient:
    config = ClientConfig(upload=False, clock=wall, monotonic=mono, boot_id=lambda: boot)
    return TelemetryClient(tmp_path / "sdk", None, POLICY, DOC, config=config)


def spend_all(c: TelemetryClient) -> None:
    for _ in range(4):
        c.record("color", "red")
    assert c.flush(10)


def total_spent(c: TelemetryClient) -> float:
    return sum(d.spent for d in c.privacy_history())


def test_five_forward_jumps_in_one_real_day_spend_one_daily_cap(tmp_path) -> None:
    wall, mono = Clock(START), Clock(1000.0)
    with client(tmp_path, wall, mono, "boot-a") as c:
        spend_all(c)
        for _ in range(5):  # every 4 real hours, the clock is moved a day forward: 20 real hours in all
            mono.t += 4 * HOUR
            wall.t += DAY + 4 * HOUR
            spend_all(c)
        assert mono.t - 1000.0 < DAY
        assert total_spent(c) <= CAP + 1e-9, [(d.day, d.spent) for d in c.privacy_history()]
        assert total_spent(c) == CAP  # the honest day's budget was still there
        assert [d.day for d in c.privacy_history()] == [20_600]


def test_the_cap_holds_across_an_app_restart_in_the_same_boot(tmp_path) -> None:
    wall, mono = Clock(START), Clock(1000.0)
    with client(tmp_path, wall, mono, "boot-a") as c:
        spend_all(c)
    mono.t += HOUR
    wall.t += 3 * DAY
    with client(tmp_path, wall, mono, "boot-a") as c:  # persisted: the monotonic anchor is on disk
        spend_all(c)
        assert total_spent(c) == CAP


def test_real_days_passing_still_open_a_budget_each_day(tmp_path) -> None:
    wall, mono = Clock(START), Clock(1000.0)
    with client(tmp_path, wall, mono, "boot-a") as c:
        spend_all(c)
        for _ in range(5):
            mono.t += DAY
            wall.t += DAY
            spend_all(c)
        assert [d.day for d in c.privacy_history()] == list(range(20_600, 20_606))
        assert total_spent(c) == 6 * CAP


def test_a_clock_moved_forward_catches_up_as_real_time_passes(tmp_path) -> None:
    wall, mono = Clock(START), Clock(1000.0)
    with client(tmp_path, wall, mono, "boot-a") as c:
        spend_all(c)
        wall.t += 5 * DAY  # jumped, then a real day passes: one new day, not five
        mono.t += DAY
        spend_all(c)
        assert [d.day for d in c.privacy_history()] == [20_600, 20_601]


def test_residual_a_reboot_trusts_the_wall_clock_once(tmp_path) -> None:
    """Monotonic time does not survive a reboot (docs/PRIVACY.md): each reboot combined with a forward
    jump opens one more daily cap; nothing more within that boot."""
    wall, mono = Clock(START), Clock(1000.0)
    with client(tmp_path, wall, mono, "boot-a") as c:
        spend_all(c)
    wall.t += DAY
    mono.t = 5.0  # a new boot: its monotonic clock starts again
    with client(tmp_path, wall, mono, "boot-b") as c:
        spend_all(c)
        for _ in range(4):
            mono.t += HOUR
            wall.t += DAY
            spend_all(c)
        assert total_spent(c) == 2 * CAP  # one cap per boot in this scenario, not six
