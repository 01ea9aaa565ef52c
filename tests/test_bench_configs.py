"""bench/bench.py's spelling of kernel configurations (parse_config) and the tile widths a bench
process may allow beside epic's (allow_tile_widths), which bench/interleaved.py and bench/prebuild.py
take as --tile-widths."""
import pytest

from .conftest import bench_module


def test_bench_configuration_spelling_of_the_trace_the_tile_order_the_load_hint_and_the_combine():
    bench = bench_module("bench")
    assert bench.parse_config("tiles") == {"trace": "tiles"}
    assert bench.parse_config("serp") == {"tile_order": "serpentine"}
    assert bench.parse_config("ping_128x192x64_c2x1_splitlast") == {
        "schedule": "pingpong", "tile": (128, 192, 64), "cluster": (2, 1), "tile_order": "split_last"}
    assert bench.parse_config("rn_s8_serp") == {"raster": "n", "swizzle": 8, "tile_order": "serpentine"}
    assert bench.parse_config("serp_nohint") == {"tile_order": "serpentine", "load_hint": "none"}
    assert bench.parse_config("tail") == {"combine": "tail"} and bench.parse_config("fold") == {"combine": "fold"}
    assert bench.parse_config("kernel") == {"combine": "kernel"}      # the combine kernel where decode takes the tail
    assert bench.parse_config("a0") == {"a_rows": 0} and bench.parse_config("tail_a16") == {"combine": "tail", "a_rows": 16}
    assert bench.parse_config("ping_128x192x64_c2x1_tiles") == {"schedule": "pingpong", "tile": (128, 192, 64),
                                                              "cluster": (2, 1), "trace": "tiles"}


def test_bench_scripts_can_allow_tile_widths_epic_does_not_list_yet(monkeypatch):
    from epic.ir import options as vocab
    monkeypatch.setattr(vocab, "TILE_N", vocab.TILE_N)       # restored after the test
    bench = bench_module("bench")
    assert vocab.value_problem("tile", (128, 176, 64)) is not None
    assert bench.allow_tile_widths("176,208") == (32, 64, 128, 176, 192, 208, 256)
    assert vocab.value_problem("tile", (128, 176, 64)) is None
    for bad in ("100", "272", "16", "x"):
        with pytest.raises(SystemExit, match="multiples of 16 from 32 to 256"):
            bench.allow_tile_widths(bad)
