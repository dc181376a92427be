"""segment_spans (triton_src/segments.py) in Triton's interpreter against a direct search
(tests/interpret_segment_spans.py): sorted documents, runs of ids that go up and down, negative
ids and the int32 extremes, ids one side lacks (tiles that find nothing give (0, 0)), tiles
longer than the sequence, and sequences longer than one scan block; and the run of positions
sharing a tile's one id, which the kernels leave unmasked."""

from pathlib import Path

import pytest

from helpers import run_interpreted

pytestmark = pytest.mark.slow  # the slow tier (-m slow): the segment-span kernel under Triton's interpreter

SCRIPT = Path(__file__).with_name("interpret_segment_spans.py")
CASES = ["sorted-documents", "documents-of-40", "sorted-q-longer-than-k", "unsorted-runs", "negative-and-extreme-ids",
         "tile-longer-than-sequence"]


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(SCRIPT, timeout=600)


def test_every_case_ran(interpreted):
    seed, rows = interpreted
    assert sorted(rows) == sorted(CASES), f"seed {seed}: {sorted(rows)}"
    # A tile whose ids the other side lacks altogether occurs in both directions.
    assert rows["negative-and-extreme-ids"]["query_tiles_empty"] > 0
    assert rows["negative-and-extreme-ids"]["key_tiles_empty"] > 0
    # Tiles of one id whose positions on the other side form one run (unmasked tiles) and tiles
    # without one (two ids in the tile, or an id that comes back after others) both occur.
    for direction in ("query_tiles", "key_tiles"):
        fixed = rows["documents-of-40"]
        assert 0 < fixed[f"{direction}_runs"] < fixed[f"{direction}_total"], (seed, fixed)
    assert rows["unsorted-runs"]["key_tiles_runs"] == 0, (seed, rows["unsorted-runs"])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("direction", ["query_tiles", "key_tiles"])
def test_spans_match_a_direct_search(interpreted, case, direction):
    seed, rows = interpreted
    assert rows[case][f"{direction}_mismatches"] == 0, f"seed {seed} {case} {direction}: {rows[case]}"
