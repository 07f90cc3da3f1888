"""bench/scale_model.py: the weight-push model's numbers, worked out by hand at the default bandwidths,
and its CLI's table."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "scale_model.py"


def _load():
    spec = importlib.util.spec_from_file_location("scale_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["scale_model"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


sm = _load()

# Default effective rates (bytes/s): PCIe 25e9; NVLink 450e9 * 0.8 = 360e9; network 400e9 / 8 * 0.9 = 45e9;
# memcpy 10e9; GPU copy 3350e9 / 2 = 1675e9. 7B in bf16: b = 14e9 bytes.
LINKS = sm.Links(pcie=25e9, nvlink=360e9, net=45e9, memcpy=10e9, device_copy=1675e9)
B = 14e9


def test_the_default_flags_give_these_links():
    assert sm.gpu_links(sm.parse_args([])) == LINKS


def test_collective_push_7b_on_one_node():
    # 4 learner GPUs + 4 engines (TP 1) on one node: every receiver is on NVLink, 360e9.
    # stream: 14e9 / 360e9                                  = 0.0388889
    # fill:   one 1 GiB bucket through the ZeRO-3 gather stage, 2**30 * (3/4) / 360e9 = 0.0022370
    # buckets: ceil(14e9 / 2**30) = 14, * 50e-6            = 0.0007
    # push (learner waits) = 0.0418259
    # load: 14e9 / 1675e9 = 0.0083582 -> pause = 0.0501841
    p = sm.collective_push(7e9, 2, sm.Cluster(), LINKS)
    assert p.bytes == B
    assert p.push_s == pytest.approx(0.0418259, rel=1e-5)
    assert p.pause_s == pytest.approx(0.0501841, rel=1e-5)
    assert p.latency_s == p.pause_s  # engines pause before receiving: the whole push is paused


def test_file_push_7b_on_one_node():
    # learner waits: gather 14e9 * (3/4) / 360e9 + 14e9 / 25e9 = 0.0291667 + 0.56 = 0.5891667
    #                serialise 14e9 / 10e9 = 1.4, ray.put 1.4          -> push = 3.3891667
    # engine, before the pause: no remote node -> fetch 0; /dev/shm write 1.4
    # paused: read 1.4 + host->GPU 14e9 / 25e9 = 0.56 + load 0.0083582 -> pause = 1.9683582
    # lands after 3.3891667 + 1.4 + 1.9683582 = 6.7575249
    p = sm.file_push(7e9, 2, sm.Cluster(), LINKS)
    assert p.parts["fetch"] == 0
    assert p.push_s == pytest.approx(3.3891667, rel=1e-6)
    assert p.pause_s == pytest.approx(1.9683582, rel=1e-6)
    assert p.latency_s == pytest.approx(6.7575249, rel=1e-6)


def test_learner_step_7b():
    # 512 * 8 * 1024 = 4,194,304 tokens; 4194304 * 6 * 7e9 = 1.76160768e17 FLOPs
    # / (4 GPUs * 989e12 * 0.4 = 1.5824e15 FLOP/s) = 111.32506 s
    step = sm.learner_step(7e9, 4)
    assert step.flops == pytest.approx(1.76160768e17)
    assert step.seconds == pytest.approx(111.32506, rel=1e-6)


def test_colocated_7b():
    # All 8 GPUs train and serve: learner 8, engines 8 (TP 1), every engine fed at NVLink speed.
    # collective: stream 0.0388889 + fill 2**30 * (7/8) / 360e9 = 0.0026098 + 14 * 50e-6 = 0.0007
    #   -> push 0.0421987, pause + 0.0083582 = 0.0505569
    # step: 1.76160768e17 / (8 * 989e12 * 0.4) = 55.662528 s
    c = sm.Cluster(colocate=True)
    assert (c.learner, c.engines, c.remote_nodes) == (8, 8, 0)
    p = sm.collective_push(7e9, 2, c, LINKS)
    assert p.push_s == pytest.approx(0.0421987, rel=1e-5)
    assert p.pause_s == pytest.approx(0.0505569, rel=1e-5)
    assert sm.learner_step(7e9, c.learner).seconds == pytest.approx(55.662528, rel=1e-6)


def test_engines_on_another_node_are_bound_by_the_network():
    # 2 nodes, the learner fills node 0 (8 GPUs), 8 engines on node 1: the broadcast runs at 45e9.
    # collective: 14e9 / 45e9 = 0.3111111 + fill 2**30 * (7/8) / 360e9 = 0.0026098 + 0.0007 = 0.3144209
    # file: node 1 fetches over the network, 14e9 / 45e9 = 0.3111111
    c = sm.Cluster(nodes=2, learner_gpus=8)
    assert (c.engines_per_node(), c.remote_nodes) == ([0, 8], 1)
    assert sm.collective_push(7e9, 2, c, LINKS).push_s == pytest.approx(0.3144209, rel=1e-5)
    assert sm.file_push(7e9, 2, c, LINKS).parts["fetch"] == pytest.approx(0.3111111, rel=1e-6)


def test_tensor_parallel_workers_receive_everything_and_load_their_shard():
    c = sm.Cluster(engine_tp=2)  # 4 free GPUs -> 2 engines
    assert c.engines == 2
    coll, file = sm.collective_push(7e9, 2, c, LINKS), sm.file_push(7e9, 2, c, LINKS)
    assert coll.parts["stream"] == pytest.approx(B / 360e9)  # full bytes per worker
    assert coll.parts["load"] == pytest.approx(B / 2 / 1675e9)
    assert file.parts["read"] == pytest.approx(B / 10e9) and file.parts["h2d"] == pytest.approx(B / 2 / 25e9)


def test_a_cluster_without_room_for_an_engine_is_refused():
    with pytest.raises(ValueError, match="no GPU left"):
        sm.Cluster(learner_gpus=8).engines_per_node()


def test_cpu_check_uses_memcpy_and_loopback():
    # SmolLM2-135M in float32: 134.5e6 * 4 = 0.538e9 bytes, memcpy 10e9, loopback 3e9.
    # file pause: read + "h2d" + load = 3 * 0.538e9 / 10e9 = 0.1614
    # collective: 0.538e9 / 3e9 = 0.1793333 + 1 bucket * 50e-6 + load 0.0538 = 0.2331833
    a = sm.parse_args(["--cpu-check"])
    links, c = sm.cpu_links(a), sm.Cluster(gpus_per_node=2, learner_gpus=1)
    assert sm.file_push(134.5e6, 4, c, links).pause_s == pytest.approx(0.1614)
    assert sm.collective_push(134.5e6, 4, c, links).pause_s == pytest.approx(0.2331833, rel=1e-6)


def test_the_cli_prints_the_table():
    out = subprocess.run([sys.executable, str(SCRIPT), "--table", "--measured-file-pause-s", "0.2"],
                         capture_output=True, text=True, check=True).stdout
    cells = [[c.strip() for c in line.split("|")[1:3]] for line in out.splitlines() if line.startswith("| ")]
    assert [tuple(c) for c in cells if c[0] in ("0.5B", "7B", "32B")] == [
        (m, t) for m in ("0.5B", "7B", "32B") for t in ("file", "collective")]
    assert "7B: file / collective = " in out and "## check against this machine" in out
    assert "0.2 (1.2x the prediction)" in out and "not given" in out


def _packing_model():
    spec = importlib.util.spec_from_file_location("_packing_model", REPO / "bench" / "_packing_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["_packing_model"] = module
    spec.loader.exec_module(module)
    return module


def test_packing_model_by_hand():
    """Three rows of 1, 2 and 4 tokens through a model of P = 10, L = 1, d = 1: a row of n costs
    6 * 10 * n + 6 * n^2. Padded: 3 rows at 4 -> 3 * (240 + 96) = 1008, computed 12 of 7 real tokens.
    Budget 8, longest first: [4, 2] (2 rows padded to 4 = 8 <= 8; adding the 1 would make 12), then [1]:
    2 * 336 + (60 + 6) = 738, computed 8 + 1 = 9 of 7. Packed: 66 + (120 + 24) + 336 = 546."""
    pm = _packing_model()
    case = pm.PackingCase(params=10, layers=1, width=1, budget=8)
    assert pm.budget_micro_batches([1, 2, 4], 8) == [[4, 2], [1]]
    sides = pm.step_flops(case, [1, 2, 4])
    assert sides["padded"] == (1008, 12 / 7)
    assert sides["token budget"] == (738, 9 / 7)
    assert sides["packed"] == (546, 1.0)


def test_packing_lengths_match_the_asked_moments():
    """Moment-matched log-normal: 20,000 draws' mean within 2 % of 8,192 (the sample mean's standard error
    is 6,144 / sqrt(20,000) = 43, 0.5 %; clipping at 256 and 32,768 moves it by well under 1 %)."""
    pm = _packing_model()
    lens = pm.lengths(pm.PackingCase(episodes=20000))
    assert abs(sum(lens) / len(lens) - 8192) < 0.02 * 8192
    assert min(lens) >= 256 and max(lens) <= 32768
