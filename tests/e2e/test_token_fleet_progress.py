"""Token enrollment of the demo's fleet reports progress once per device (issue #30), through the real issuer."""

from __future__ import annotations

from types import SimpleNamespace

from simulator.token_fleet import LocalIssuer, pay_fleet


def test_pay_fleet_calls_back_once_per_enrolled_device(tmp_path) -> None:
    devices, metrics = 3, 2
    # pay_fleet reads only each batch's id: batch k·devices + i is device i's upload of metric k
    batches = [SimpleNamespace(batch_id=bytes([k, i])) for k in range(metrics) for i in range(devices)]
    seen: list[int] = []
    with LocalIssuer(tmp_path / "issuer", tokens_per_day=metrics) as issuer:
        paid = pay_fleet(issuer, batches, devices, on_device=seen.append)  # type: ignore[arg-type]
        issued = issuer.issued()
    assert seen == list(range(devices))
    assert paid.fetched == issued == devices * metrics
