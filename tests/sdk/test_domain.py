"""Value -> index mapping: dictionaries, the other bucket, hashed domains."""

import subprocess
import sys

import pytest
import xxhash

from ldp_core.domain import Dictionary, HashedDomain, canonical_bytes, domain_from_dict
from ldp_core.errors import DomainError, SpecError


def test_dictionary_indices_and_other_bucket() -> None:
    d = Dictionary(("😂", "❤️", "👍"), other=True)
    assert d.size == 4
    assert [d.index_of(v) for v in ("😂", "❤️", "👍")] == [0, 1, 2]
    assert d.index_of("🙃") == 3 == d.other_index
    assert d.label(3) == "(other)"


def test_dictionary_without_other_rejects_unknown_values() -> None:
    d = Dictionary((1, 2, 3))
    assert d.index_of(2) == 1
    with pytest.raises(DomainError, match="not in the metric's dictionary"):
        d.index_of(4)
    with pytest.raises(DomainError):
        d.index_of("2")  # a string is not the integer 2


@pytest.mark.parametrize("values", [("a", "a"), ("a",)])
def test_bad_dictionaries(values: tuple) -> None:
    with pytest.raises(SpecError):
        Dictionary(values)


def test_hashed_domain_is_xxh32_of_the_canonical_form() -> None:
    h = HashedDomain(1000, seed=7)
    expected = xxhash.xxh32_intdigest(b"s" + b"https://example.org", seed=7) % 1000
    assert h.index_of("https://example.org") == expected
    assert canonical_bytes(5) == b"i" + (5).to_bytes(8, "little")
    assert canonical_bytes(5) != canonical_bytes("5")


def test_hashed_domain_is_stable_across_processes() -> None:
    code = "from ldp_core.domain import HashedDomain; print(HashedDomain(4096, 3).index_of('emoji:😂'))"
    outs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert outs == {f"{HashedDomain(4096, 3).index_of('emoji:😂')}\n"}


def test_round_trip_through_dict() -> None:
    for dom in (Dictionary(("x", "y"), True), HashedDomain(64, 1)):
        assert domain_from_dict(dom.to_dict()) == dom
    with pytest.raises(SpecError):
        domain_from_dict({"kind": "bloom"})
    with pytest.raises(SpecError):
        HashedDomain(1)
