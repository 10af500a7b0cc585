"""The heavy-hitter end-of-value marker (``end_marker`` 1; docs/HEAVY_HITTERS.md, *The end of a value*).

Under version 1 a value may not contain control characters, so the padding byte 0x00 is the only
member of its block and no candidate other than the value itself can follow a word's last character.
These tests check the device side (refusals, byte-identical padding and records, spec ids, metrics
file) and the server side (a real value is never pruned at any level; junk siblings always are).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from estimator.mechanisms.heavy_hitters import _possible_fragments, extend_prefixes, possible_prefixes
from ldp_core.errors import DomainError, SpecError
from ldp_core.mechanisms.heavy_hitters import PEMSpec, SFPSpec, pad_value, pad_values
from ldp_core.metrics import MetricsFileError, parse_metrics
from tests.support.vectors import VECTORS_DIR

ALPHABET = list("abcdefghijklmnopqrstuvwxyz0123456789 -_.'") + ["é", "ß", "日", "本", "😀", "€", "ñ"]


def _random_values(rng: np.random.Generator, count: int) -> list[str]:
    out = []
    for _ in range(count):
        k = int(rng.integers(1, 14))
        out.append("".join(ALPHABET[int(i)] for i in rng.integers(0, len(ALPHABET), size=k)))
    return out


@pytest.mark.parametrize("value", ["a\nb", "\t", "x\x7f", "weather\r", "a\x1fb", "ok\x01" + "z" * 20])
def test_version_1_refuses_control_characters_and_version_0_keeps_them(value: str) -> None:
    with pytest.raises(DomainError, match="control characters"):
        pad_value(value, 8, "truncate", 1)
    assert pad_value(value, 8, "truncate", 0)[:1] == value.encode()[:1]  # today's behaviour: accepted


def test_version_1_pads_every_other_value_as_version_0() -> None:
    values = _random_values(np.random.default_rng(1), 500)
    for length in (4, 8, 12):
        assert pad_values(values, length, "truncate", 1).tobytes() == pad_values(values, length).tobytes()
    with pytest.raises(DomainError, match="NUL"):
        pad_value("a\x00", 8, "truncate", 1)


def test_spec_ids_stay_for_version_0_and_records_are_byte_identical() -> None:
    pinned = json.loads((VECTORS_DIR / "spec_ids.json").read_text())
    for entry in pinned["specs"]:
        if entry["spec"].get("mechanism") == "pem":
            spec = PEMSpec(**{k: v for k, v in entry["spec"].items() if k != "mechanism"})
            assert spec.spec_id == entry["spec_id"]
            assert PEMSpec(**{**spec.params(), "end_marker": 0}).spec_id == entry["spec_id"]
            v1 = PEMSpec(**{**spec.params(), "end_marker": 1})
            assert v1.spec_id != entry["spec_id"] and v1.params()["end_marker"] == 1
    values = _random_values(np.random.default_rng(2), 300)
    for make in (
        lambda m: PEMSpec(epsilon=3.0, length=8, start_bits=12, step_bits=4, end_marker=m),
        lambda m: PEMSpec(epsilon=3.0, length=8, oracle="hcms", end_marker=m),
        lambda m: SFPSpec(epsilon=3.0, length=8, num_hashes=16, width=64, end_marker=m),
    ):
        old, new = make(0), make(1)
        assert "end_marker" not in old.params() and new.params()["end_marker"] == 1
        a = old.encode(values, np.random.default_rng(9))
        b = new.encode(values, np.random.default_rng(9))
        assert a.tobytes() == b.tobytes()
    for bad in (2, -1, True, 1.0, "1"):
        with pytest.raises(SpecError, match="end_marker must be 0 or 1"):
            PEMSpec(epsilon=1.0, end_marker=bad)  # type: ignore[arg-type]
        with pytest.raises(SpecError, match="end_marker must be 0 or 1"):
            SFPSpec(epsilon=1.0, end_marker=bad)  # type: ignore[arg-type]


def _metrics(domain: dict, mechanism: dict) -> dict:
    return {
        "format": "ldp-metrics/1",
        "metrics": {
            "w": {
                "kind": "heavy_hitters",
                "description": "d",
                "owner": "o@example.org",
                "expires": "2030-01-01",
                "mechanism": mechanism,
                "domain": domain,
                "max_reports_per_day": 1,
            }
        },
    }


def test_metrics_file_declares_the_marker_on_the_domain() -> None:
    dom = {"kind": "string", "length": 8, "overflow": "truncate", "end_marker": 1}
    ms = parse_metrics(_metrics(dom, {"mechanism": "pem", "epsilon": 2.0}))
    assert ms["w"].spec.end_marker == 1  # type: ignore[attr-defined]
    assert parse_metrics(ms.to_dict())["w"].spec.spec_id == ms["w"].spec.spec_id
    with pytest.raises(DomainError, match="control"):
        ms["w"].domain.index_of("a\tb")
    old = parse_metrics(_metrics({**dom, "end_marker": 0}, {"mechanism": "pem", "epsilon": 2.0}))
    assert old["w"].domain.to_dict() == {"kind": "string", "length": 8, "overflow": "truncate"}
    assert old["w"].domain.index_of("a\tb")[:3] == b"a\tb"
    with pytest.raises(MetricsFileError, match="end_marker"):
        parse_metrics(_metrics(dom, {"mechanism": "pem", "epsilon": 2.0, "end_marker": 0}))
    with pytest.raises(MetricsFileError, match="end_marker must be 0 or 1"):
        parse_metrics(_metrics({**dom, "end_marker": 2}, {"mechanism": "sfp", "epsilon": 2.0}))


@pytest.mark.parametrize("step", [1, 3, 4, 5])
def test_no_prefix_of_a_real_value_is_pruned(step: int) -> None:
    """Every level's prefix of every accepted value is possible (else discovery could never find it)."""
    length = 12
    rows = pad_values(_random_values(np.random.default_rng(3 + step), 400), length, "truncate", 1)
    spec = PEMSpec(epsilon=2.0, length=length, start_bits=8 + step % 3, step_bits=step, end_marker=1)
    for level in range(spec.num_levels):
        bits = spec.level_bits(level)
        pre = np.unpackbits(rows, axis=1)
        pre[:, bits:] = 0
        mask = possible_prefixes(np.packbits(pre, axis=1), bits, level == spec.num_levels - 1, 1)
        assert mask.all(), [bytes(r) for r in rows[~mask]]
    for pos in range(length // 2):
        frags = rows[:, 2 * pos].astype(np.int64) << 8 | rows[:, 2 * pos + 1]
        assert _possible_fragments(pos)[frags].all()


def test_a_short_word_has_one_completion_under_version_1() -> None:
    for word in ("weather", "recipes", "cat", "café"):
        parent = pad_values([word], 12)
        bits = 8 * len(word.encode())
        grown = extend_prefixes(parent, bits, bits + 4)  # the first nibble after the word
        grown = extend_prefixes(grown[possible_prefixes(grown, bits + 4, False, 1)], bits + 4, bits + 8)
        kept = grown[possible_prefixes(grown, bits + 8, False, 1)]
        assert word.encode() + b"\x00" in {bytes(r[: len(word.encode()) + 1]) for r in kept}
        assert all(r[len(word.encode())] == 0 or r[len(word.encode())] >= 0x20 for r in kept)
        # the pad's own block holds nothing else: after a high nibble 0 only 0x00 can follow
        zero = extend_prefixes(np.packbits(np.unpackbits(parent, axis=1), axis=1), bits + 4, bits + 8)
        assert [bytes(r) for r in zero[possible_prefixes(zero, bits + 8, False, 1)]] == [bytes(parent[0])]
        assert possible_prefixes(zero, bits + 8, False, 0).sum() == 16  # version 0: 15 junk siblings


def test_modified_devices_cannot_get_a_control_character_discovered() -> None:
    """A fleet of modified devices skips the refusal and reports padded values holding control bytes
    (the encoders take padded rows as they are): under version 1 the server never even ranks them."""
    from estimator.mechanisms.heavy_hitters import discover_pem, discover_sfp

    hostile = pad_values(["\x1b[2Jx", "ok\rno", "bell\x07"], 8)  # version 0 pads them; version 1 would refuse
    honest = pad_values(["weather", "news"], 8, "truncate", 1)
    rows = np.repeat(np.vstack([hostile, honest]), [6000, 6000, 6000, 4000, 3000], axis=0)
    rng = np.random.default_rng(31)
    pem = PEMSpec(epsilon=8.0, length=8, start_bits=12, step_bits=4, end_marker=1)
    found = {h.value for h in discover_pem(pem, pem.encode(rows, rng), top=8).found}
    assert {"weather", "news"} <= found and not any(ord(ch) < 0x20 for v in found for ch in v), found
    sfp = SFPSpec(epsilon=8.0, length=8, sketch="cms", num_hashes=16, width=1024, word_share=0.25, end_marker=1)
    found = {h.value for h in discover_sfp(sfp, sfp.encode(rows, rng), top=8, fragments=512).found}
    assert not any(ord(ch) < 0x20 for v in found for ch in v), found
    # version 0 ranks and finds them: what the pruning takes away
    old = PEMSpec(epsilon=8.0, length=8, start_bits=12, step_bits=4)
    assert "ok\rno" in {h.value for h in discover_pem(old, old.encode(rows, rng), top=8).top(8)}
