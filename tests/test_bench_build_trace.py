"""bench/build_trace.py on a small hand-written trace in nvcc's format: cicc's events only, self time
is an event's time less its children's, a family nested in itself counts once inclusively."""
import json

from .conftest import bench_module


def _event(pid, ts, dur, name, detail):
    return json.dumps({"args": {"detail": detail}, "dur": dur, "name": name, "ph": "X", "pid": pid,
                       "tid": 0, "ts": ts}, separators=(",", ":"))


def _trace(tmp_path):
    head = ('{"otherData" : {}, "traceEvents" : [ {}\n'
            ', {"args" : {"name" : "cicc"}, "cat" : "", "name" : "process_name", "ph" : "M", "pid" : 7}\n'
            ', {"args" : {"name" : "ptxas"}, "cat" : "", "name" : "process_name", "ph" : "M", "pid" : 8}\n')
    inst = "Instantiating Template Function"
    events = [
        _event(7, 0, 100, "CUDA C++ Front-End", "k.ii"),
        _event(7, 10, 60, inst, "cute::get<0, int>"),           # get inside get: one family
        _event(7, 20, 30, inst, "cute::get<1, long>"),
        _event(7, 75, 20, inst, "cute::copy<A>"),
        _event(8, 0, 500, "ptxas", "k.ptx"),                      # not cicc's
    ]
    path = tmp_path / "k.trace.json"
    path.write_text(head + "".join("," + e for e in events) + "]}")
    return path


def test_the_summary_splits_self_and_inclusive_time_of_ciccs_events(tmp_path):
    bt = bench_module("build_trace")
    path = _trace(tmp_path)
    assert bt.cicc_pid(str(path)) == 7
    evs = [e[1:] for e in bt.events(str(path)) if e[0] == 7]
    assert len(evs) == 4
    own, inclusive = bt.summarize(evs)
    front = ("CUDA C++ Front-End", "k.ii")
    get = ("Instantiating Template F", "cute::get<>")
    copy = ("Instantiating Template F", "cute::copy<>")
    assert own[front] == 100 - 60 - 20
    assert own[get] == 60                  # 30 of the outer get's own + the inner get's 30
    assert own[copy] == 20
    assert inclusive[get] == 60            # not 90: the inner get is inside the outer one
    assert inclusive[front] == 100


def test_a_trace_split_across_chunks_loses_no_event(tmp_path, monkeypatch):
    bt = bench_module("build_trace")
    path = _trace(tmp_path)
    monkeypatch.setattr(bt, "CHUNK", 7)                        # every event crosses a chunk boundary
    assert sorted(e[2] for e in bt.events(str(path))) == [20, 30, 60, 100, 500]
