"""When a dragging shard fetch is hedged: only when it is slower than the fetches from other sources in flight."""

from __future__ import annotations

from shardcast.client.transfer import DRAG_RATIO, _Attempt, is_dragging


def attempt(source: str, started: float, received: int) -> _Attempt:
    return _Attempt(source, hedge=False, started=started, received=received)


def test_fetches_sharing_one_slow_link_do_not_drag() -> None:
    """Every fetch gets its share of this machine's 100 Mbit/s link: another source would not be faster."""
    now = 10.0
    fetches = [attempt("http://relay-a", 7.0, 4_000_000), attempt("http://relay-b", 7.0, 3_700_000)]
    fetches += [attempt("http://relay-a", 7.5, 3_100_000), attempt("http://relay-b", 8.0, 2_600_000)]
    assert not any(is_dragging(fetch, fetches, now) for fetch in fetches)


def test_a_stalled_source_drags_next_to_a_flowing_one() -> None:
    now = 10.0
    stalled = attempt("http://relay-a", 7.0, 1000)
    flowing = [attempt("http://relay-b", 7.0, 4_000_000), attempt("http://relay-b", 8.0, 2_700_000)]
    assert is_dragging(stalled, [stalled, *flowing], now)
    assert not any(is_dragging(fetch, [stalled, *flowing], now) for fetch in flowing)


def test_a_fetch_just_below_the_ratio_does_not_drag_and_just_above_does() -> None:
    now = 10.0
    peer = attempt("http://relay-b", 0.0, 1_000_000)  # 100 kB/s
    slower = attempt("http://relay-a", 0.0, int(1_000_000 / DRAG_RATIO) - 10_000)
    close = attempt("http://relay-a", 0.0, int(1_000_000 / DRAG_RATIO) + 10_000)
    assert is_dragging(slower, [slower, peer], now)
    assert not is_dragging(close, [close, peer], now)


def test_with_nothing_to_compare_with_a_slow_fetch_drags() -> None:
    """Alone, or next to fetches of its own source only, or next to ones too young to tell: hedge as before."""
    now = 10.0
    alone = attempt("http://relay-a", 7.0, 1000)
    same_source = attempt("http://relay-a", 7.0, 4_000_000)
    young = attempt("http://relay-b", 9.9, 100_000)
    assert is_dragging(alone, [alone], now)
    assert is_dragging(alone, [alone, same_source], now)
    assert is_dragging(alone, [alone, young], now)
