"""bench/tile_trace.py's reading of a trace=tiles buffer, on a hand-made timeline of one CTA whose two
warp groups take turns on two tiles each: each phase's length, the handoffs, and the tensor cores'
idle time (the GPU side runs on the H200 only)."""
from .conftest import bench_module

# warp group -> tiles -> the 7 event clocks (mma begin, data, issued, retired, epi begin, stored, end)
TIMELINE = [
    [[100, 150, 1000, 1200, 1300, 1700, 1800],       # WG0 tile 0
     [1950, 1960, 2800, 3000, 3050, 3400, 3500]],    # WG0 tile 1: turn wait 150, handoff 50
    [[1020, 1030, 1900, 2100, 2150, 2500, 2600],     # WG1 tile 0: handoff 20
     [2830, 3100, 3700, 3900, 3950, 4300, 4400]],    # WG1 tile 1: turn wait 230, 270 waiting for data
]


# the producer's (load() entered, first stage free, load() returned) of the CTA's tiles in load order:
# WG0 t0, WG1 t0, WG0 t1, WG1 t1
LOADS = [[20, 40, 90], [100, 130, 1000], [1050, 1060, 1900], [1950, 2500, 2700]]


def buffer(ctas: int = 3, tiles: int = 4):
    wg = [[[[0] * 7 for _ in range(tiles)] for _ in range(2)] for _ in range(ctas)]
    loads = [[[0, 0, 0] for _ in range(2 * tiles)] for _ in range(ctas)]
    cta = [[0] * 8 for _ in range(ctas)]
    for w in (0, 1):
        for t, ev in enumerate(TIMELINE[w]):
            wg[1][w][t] = list(ev)            # CTA 1 ran; CTAs 0 and 2 recorded nothing
    loads[1][:4] = [list(v) for v in LOADS]
    cta[1][1:8] = [5_000, 100, 2, 2, 4, 9_000, 4_300]      # global ns at its first tile and its last epilogue
    return wg, loads, cta, ctas


def test_one_ctas_phases_handoffs_and_idle_tensor_time():
    tt = bench_module("tile_trace")
    wg, loads, cta, _ = buffer()
    s = tt.cta_summary(wg[1], (2, 2), loads[1][:4])
    assert s["tiles"] == 4
    p = s["phases"]
    assert p["turn wait"] == [150, 230]
    assert p["data"] == [50, 10, 10, 270]
    assert p["issue"] == [850, 840, 870, 600]
    assert p["drain"] == [200, 200, 200, 200]
    assert p["epi wait"] == [100, 50, 50, 50]
    assert p["epilogue"] == [400, 350, 350, 350]
    assert p["store tail"] == [100, 100, 100, 100]
    assert s["handoffs"] == [20, 50, 30]
    # busy [150, 1200], [1030, 2100], [1960, 3000], [3100, 3900]: a 100-cycle hole in a 3750-cycle span
    assert s["idle"] == 100
    assert s["lead"] == [80, 920, 900, 880]       # pingpong: load p is warp group p % 2's tile p // 2
    assert s["to data"] == [110, 900, 900, 600]   # first stage free -> the consumer's data
    assert s["stage wait"] == [20, 30, 10, 550]   # load() entered -> first stage free
    assert s["between"] == [10, 50, 50]           # load() returned -> the next load() entered
    cooperative = tt.cta_summary(wg[1], (2, 2), loads[1][:4], pingpong=False)
    assert cooperative["lead"] == [80, 1850]        # cooperative: load p is tile p of both warp groups
    assert cooperative["to data"] == [110, 1830]
    assert cooperative["handoffs"] == [] and cooperative["idle"] == 100


def test_the_summary_skips_ctas_that_recorded_nothing_and_reports_per_k_block():
    tt = bench_module("tile_trace")
    wg, loads, cta, ctas = buffer()
    s = tt.summarize(wg, cta, ctas, k_blocks=2, cycles_per_block=400.0, loads=loads)
    assert (s["ctas"], s["tiles"]) == (1, 4)
    assert s["phases"]["data"] == (10.0, 30.0, 105.0)     # inclusive quartiles of 10, 10, 50, 270
    assert s["handoff"] == (25.0, 30.0, 40.0)
    assert s["idle per tile"] == (25.0, 25.0, 25.0)
    assert s["issue per k-block"][1] == 422.5
    assert s["producer lead"][1] == 890.0
    assert s["producer between tiles"] == (30.0, 50.0, 50.0)
    assert s["first stage wait"] == (17.5, 25.0, 160.0)
    assert s["first load to data"] == (477.5, 750.0, 900.0)
    lines = tt.report("plain", s)
    assert lines[0] == "plain: 1 CTAs, 4 tiles; cycles, median [quartiles]"
    assert lines[2].split() == ["data", "30", "[10-105]"]
    assert lines[-4].split() == ["peak", "per", "k-block", "400"]
    # the CTA's last tile is WG1's second (it took the tensor cores last): epilogue 3950 -> 4300, and
    # 4400 - 3900 from its k-blocks retiring to its stores' end; 500 cycles at 1.05 GHz of a 4 us span
    assert s["last tile's epilogue"] == (350.0, 350.0, 350.0)
    assert s["after the last k-block"] == (500.0, 500.0, 500.0)
    assert lines[-1] == "  after a CTA's last k-block (median): 0.5 us, 11.9% of the span"


def test_a_tile_whose_later_phases_were_not_reached_counts_only_those_it_reached():
    tt = bench_module("tile_trace")
    cut = [[100, 150, 1000, 0, 0, 0, 0]]      # the kernel was stopped after issuing
    p = tt.phases(cut)
    assert p["data"] == [50] and p["issue"] == [850] and p["drain"] == [] and p["epilogue"] == []
    wg = [[cut[0], [0] * 7], [[0] * 7, [0] * 7]]
    s = tt.cta_summary(wg, (1, 0))
    assert s["last epilogue"] == [] and s["after tensor"] == []     # its last tile never retired


def test_k_blocks_and_peak_cycles_come_from_the_kernel_name():
    tt = bench_module("tile_trace")
    assert tt.k_blocks_of("plain.ping_128x192x64_c2x1_tiles", 1024) == (16, 768.0)
    assert tt.k_blocks_of("up.coop_256x128x64_c2x1_e128x64_tiles", 4100) == (65, 1024.0)
    assert tt.k_blocks_of("plain.ping_128x192x64_c2x1_tiles", None) == (None, None)
    assert tt.k_blocks_of("combine_kernel", 1024) == (None, None)



def test_across_ctas_the_span_the_spread_of_their_ends_and_the_idle_tail():
    tt = bench_module("tile_trace")
    wg, loads, cta, ctas = buffer()
    assert tt.across_ctas(cta, ctas) == {"span us": 4.0, "end spread us": 0.0, "first-free span us": 4.0,
                                         "tail share": 0.0, "tiles per CTA": (4, 4),
                                         "clock GHz": 1.05}   # 4200 cycles in 4 us
    cta[2][1:8] = [5_400, 100, 1, 2, 3, 7_000, 3_000]          # a CTA of 3 tiles, done 2 us before the other
    a = tt.across_ctas(cta, ctas)
    assert (a["span us"], a["end spread us"], a["tiles per CTA"]) == (4.0, 2.0, (3, 4))
    assert a["clock GHz"] == (1.05 + 1.8125) / 2              # the other SM: 2900 cycles in 1.6 us
    assert a["tail share"] == 0.25                              # (0 + 2 us) / 2 CTAs / 4 us
    # first free: CTA 1 (1 us a tile from 5 us) and CTA 2 (0.533 us from 5.4 us) share the 7 tiles 3 / 4,
    # the last ending at 8 us: 3 us from the first start instead of 4
    assert abs(a["first-free span us"] - 3.0) < 1e-9
    lines = tt.report("k", tt.summarize(wg, cta, ctas))
    assert lines[-2] == ("  the same tiles each given to the CTA free first, at each CTA's own pace per tile (a model "
                         "of a dynamic scheduler): span 3.0 us")
    wg[1][1][1][tt.RETIRED] = 0        # the last tile's k-blocks never retired: no such line, no nan printed
    assert tt.report("k", tt.summarize(wg, cta, ctas))[-1] == lines[-2]
    assert lines[-3] == (
        "  across CTAs: span 4.0 us, ends 2.0 us apart, idle after the last tile 25.0% of the span on average, "
        "3-4 tiles per CTA, SM clock 1.43 GHz")
