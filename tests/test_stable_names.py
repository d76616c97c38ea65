"""A small model change makes a small benchmark diff (issue 15): names come from what
a value is, so a change renames only nearby lines. Pairs captured at test time."""

from __future__ import annotations

import pytest

from tests.workload_pairs import PAIRS, benchmark_of, code_changes, masked

pytestmark = pytest.mark.slow


def _pair(name, tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    make_a, make_b = PAIRS[name]
    return benchmark_of(make_a, tmp_path, "a"), benchmark_of(make_b, tmp_path, "b")


def test_inserting_a_layer_rewrites_little_besides_the_layer(tmp_path):
    old, new = _pair("insert one layer", tmp_path)
    removed, added = code_changes(old, new)
    growth = len(new.splitlines()) - len(old.splitlines())
    # Numbered names rewrote about 5x the new lines; the target (make bench) is 1.5x.
    assert growth > 40 and len(removed) + len(added) <= 2.0 * growth
    assert "linear_w = inputs[\"linear_w\"]" in new  # the first layer keeps its names
    # ... and so does the last: only lines that read a changed value change.
    assert not [line for line in removed if line.lstrip().startswith("linear_w_10x128")]


def _numbers_only(name, tmp_path, tries=3) -> list[tuple[list[str], list[str]]]:
    """Up to ``tries`` captured pairs, until one differs in numbers only. Two captures of
    one step differ now and then in what the trace records (the allocator reuses a
    storage id, or not): about one pair in six here; names by first appearance rewrote
    every pair."""
    seen = []
    for k in range(tries):
        removed, added = code_changes(*_pair(name, tmp_path / str(k)))
        seen.append((removed, added))
        if masked(removed) == masked(added):
            break
    return seen


def test_a_batch_size_change_changes_only_numbers(tmp_path):
    removed, added = _numbers_only("batch size", tmp_path)[-1]
    assert removed and masked(removed) == masked(added)


def test_the_same_model_twice_changes_no_code(tmp_path):
    removed, added = _numbers_only("same model twice", tmp_path)[-1]
    assert masked(removed) == masked(added)
