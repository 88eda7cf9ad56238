"""The sides' sized LRU: bounded by entries and by bytes, the least recently used out first."""

from __future__ import annotations

import pytest

from ctxproxy.plumbing.lru import SizedLRU


def test_the_least_recently_used_goes_past_the_entry_bound() -> None:
    lru: SizedLRU[str, int] = SizedLRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # "a" is now the most recent
    lru.put("c", 3)
    assert "b" not in lru and list(lru) == ["a", "c"]
    assert lru.get("b") is None and lru.get("b", 0) == 0


def test_bytes_bound_evicts_until_the_new_value_fits() -> None:
    lru: SizedLRU[str, bytes] = SizedLRU(100, max_bytes=10, size_of=len)
    lru.put("a", b"xxxx")
    lru.put("b", b"yyyy")
    assert lru.bytes == 8
    lru.put("c", b"zzzzz")  # 13 > 10: "a" goes, then 9 fits
    assert list(lru) == ["b", "c"] and lru.bytes == 9


def test_a_value_over_the_byte_bound_is_not_kept_and_evicts_nothing() -> None:
    lru: SizedLRU[str, bytes] = SizedLRU(100, max_bytes=10, size_of=len)
    lru.put("a", b"xxxx")
    assert lru.put("big", b"x" * 11) is False
    assert list(lru) == ["a"] and lru.bytes == 4


def test_replacing_a_key_counts_its_bytes_once() -> None:
    lru: SizedLRU[str, bytes] = SizedLRU(100, max_bytes=10, size_of=len)
    lru.put("a", b"xxxx")
    lru.put("a", b"yy")
    assert lru.bytes == 2 and lru.get("a") == b"yy" and len(lru) == 1
    assert lru.put("a", b"z" * 11) is False and "a" not in lru and lru.bytes == 0


def test_pop_and_clear_give_the_bytes_back() -> None:
    lru: SizedLRU[str, bytes] = SizedLRU(100, max_bytes=10, size_of=len)
    lru.put("a", b"xxxx")
    lru.put("b", b"yy")
    assert lru.pop("a") == b"xxxx" and lru.bytes == 2
    assert lru.pop("a") is None
    lru.clear()
    assert len(lru) == 0 and lru.bytes == 0


def test_at_least_one_entry() -> None:
    with pytest.raises(ValueError):
        SizedLRU(0)


def test_bytes_alone_bound_it_when_entries_do_not() -> None:
    lru: SizedLRU[int, bytes] = SizedLRU(None, max_bytes=100, size_of=len)
    for n in range(50):
        lru.put(n, b"x")
    assert len(lru) == 50
    lru.put(99, b"y" * 60)
    assert lru.bytes <= 100 and 99 in lru and 0 not in lru
