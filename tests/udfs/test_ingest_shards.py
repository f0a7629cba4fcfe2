import pytest

from udfs.ingest import plan_shards


@pytest.mark.parametrize(("n", "size", "overlap"), [(1, 256, 8), (10, 4, 2), (256, 256, 8), (1000, 256, 0)])
def test_every_frame_owned_once_and_ranges_clipped(n, size, overlap):
    shards = plan_shards(n, size, overlap)
    owned = [f for _, _, a, b in shards for f in range(a, b)]
    assert owned == list(range(n))
    for start, stop, own_start, own_stop in shards:
        assert start == max(0, own_start - overlap)
        assert stop == min(n, own_stop + overlap)


def test_shard_sizes():
    assert plan_shards(10, 4, 1) == [(0, 5, 0, 4), (3, 9, 4, 8), (7, 10, 8, 10)]
