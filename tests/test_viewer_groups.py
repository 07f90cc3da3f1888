"""The run viewer's group view (`/api/group`, #group/<source>/<i>) and its group filters, over a synthetic run
folder written by the run's own writers (tests/viewer_run.py), in the API and in headless chromium."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from agentrl.rollout.records import RolloutWriter, read_records
from agentrl.types import Group
from test_viewer import Served, chromium, wait_for
from viewer_run import episode, make_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("groups") / "run", dropped=True)


@pytest.fixture(scope="module")
def served(run_dir):
    s = Served(run_dir)
    yield s
    s.close()


def groups_of(recs: list[dict]) -> dict[tuple, list[int]]:
    out: dict[tuple, list[int]] = {}
    for i, r in enumerate(recs):
        out.setdefault((r["step"], r["group_id"], r.get("dropped")), []).append(i)
    return out


def mean_advantage(r: dict) -> float | None:
    values = [v for v in r.get("advantages") or [] if v is not None]
    return round(sum(values) / len(values), 4) if values else None


def common_prefix(ledgers: list[list[int]]) -> int:
    """The slow reference: the longest k with every ledger's first k tokens alike."""
    k = 0
    while all(len(t) > k for t in ledgers) and len({t[k] for t in ledgers}) == 1:
        k += 1
    return k


def test_dropped_groups_are_written_flagged_without_learner_values(tmp_path):
    rng = random.Random(3)
    path = tmp_path / "rollouts.jsonl"
    writer = RolloutWriter(path, sample_groups=1, seed=5)
    kept = Group(1, {"id": "a"}, [episode(rng, 0, 1, s, 1) for s in range(2)])
    filtered = [Group(g, {"id": g}, [episode(rng, 0, g, s, 1) for s in range(3)]) for g in (7, 8)]
    writer.write(0, [kept])
    writer.write_dropped(0, filtered, "filtered")
    writer.write_dropped(1, [], "filtered")  # a step that dropped nothing writes nothing
    writer.close()
    recs = read_records(path)
    assert [r.get("dropped") for r in recs] == [None, None, "filtered", "filtered", "filtered"]
    assert len({r["group_id"] for r in recs[2:]}) == 1  # sampled as `write` samples: one whole group
    assert all("advantages" not in r and r["task"]["id"] == r["group_id"] for r in recs[2:])


def test_the_group_of_an_episode_is_its_samples_side_by_side(served, run_dir):
    recs = read_records(run_dir / "rollouts.jsonl")
    for i in (0, 5, 37, len(recs) - 1):
        ids = groups_of(recs)[(recs[i]["step"], recs[i]["group_id"], recs[i].get("dropped"))]
        got = served.get("/api/group", i=str(i)).json()
        assert [s["i"] for s in got["samples"]] == ids
        assert [s["advantage"] for s in got["samples"]] == [mean_advantage(recs[j]) for j in ids]
        assert [s["reward"] for s in got["samples"]] == [recs[j]["reward"] for j in ids]
        assert [e["advantages"] if "advantages" in recs[j] else None for e, j in zip(got["episodes"], ids)] == [
            recs[j].get("advantages") for j in ids]
        assert got["diverge"] == common_prefix([recs[j]["tokens"] for j in ids]) == 4  # after the 4-token prompt
        assert got["samples"][0]["from_diverge"] == "".join(recs[ids[0]]["token_text"][4:20])
        assert got["dropped"] == recs[i].get("dropped")
    assert served.get("/api/group", i="99999").status_code == 404


def test_the_group_filters(served, run_dir):
    recs = read_records(run_dir / "rollouts.jsonl")
    equal = []
    for ids in groups_of(recs).values():
        done = [recs[j] for j in ids if recs[j]["status"] in ("ok", "truncated")]
        if len(done) >= 2 and len({r["reward"] for r in done}) == 1:
            equal += ids
    got = served.get("/api/episodes", groups="equal", limit="500").json()
    assert [r["i"] for r in got["rows"]] == sorted(equal) and got["total"] > 0
    assert all(r["equal_rewards"] for r in got["rows"])
    dropped = served.get("/api/episodes", groups="dropped", limit="500").json()
    assert [r["i"] for r in dropped["rows"]] == [i for i, r in enumerate(recs) if r.get("dropped")]
    assert {recs[r["i"]]["dropped"] for r in dropped["rows"]} == {"filtered", "stale"}
    bad = served.get("/api/episodes", groups="odd")
    assert bad.status_code == 400 and bad.text.startswith("groups='odd'")
    # GRPO: a trained group with equal rewards got advantage 0 on every scored token
    assert {r["advantage"] for r in got["rows"] if r["advantage"] is not None} == {0.0}


def test_the_group_view_in_chromium(served, run_dir, tmp_path):
    from selenium.webdriver.common.by import By

    recs = read_records(run_dir / "rollouts.jsonl")
    pick = next(i for i, r in enumerate(recs) if r.get("advantages") and r["group_id"] % 4 == 2)
    ids = groups_of(recs)[(recs[pick]["step"], recs[pick]["group_id"], None)]
    driver = chromium()
    try:
        driver.get(served.url + f"/#episode/train/{pick}")  # from the episode, its group
        wait_for(driver, "return document.querySelectorAll('#episode .ledger .tk').length > 0")
        driver.find_element(By.ID, "to-group").click()
        wait_for(driver, "return document.body.dataset.groupLoaded === '1'")
        rows = driver.find_elements(By.CSS_SELECTOR, "#group-samples tbody tr")
        assert [int(tr.get_attribute("data-i")) for tr in rows] == ids
        shown = [tr.find_element(By.CSS_SELECTOR, "td.adv").text for tr in rows]
        assert [None if t == "–" else float(t) for t in shown] == [mean_advantage(recs[j]) for j in ids]
        assert [len(s.find_elements(By.CSS_SELECTOR, ".tk")) for s in
                driver.find_elements(By.CSS_SELECTOR, ".group-ledgers .ledger")] == [len(recs[j]["tokens"]) for j in ids]
        assert driver.execute_script("return document.querySelector('#group #colour-by').value") == "advantage"
        # a sample with a non-zero advantage: its generated tokens are coloured, green above 0, red below
        j = next(j for j in ids if mean_advantage(recs[j]))
        gen = recs[j]["loss_mask"].index(1)
        colour = driver.find_element(By.CSS_SELECTOR, f'.sample[data-i="{j}"] .tk[data-i="{gen}"]').value_of_css_property(
            "background-color")
        r, g = (int(x) for x in colour[colour.index("(") + 1:].split(",")[:2])
        assert (g > r) == (mean_advantage(recs[j]) > 0), colour
        assert len(driver.find_elements(By.CSS_SELECTOR, ".group-ledgers .tk.parted")) == len(ids)
        driver.save_screenshot(str(Path(os.environ.get("AGENTRL_VIEWER_SHOTS", tmp_path)) / "viewer-group.png"))
        # the list: groups with equal rewards, then a dropped group's link opens its group
        driver.get(served.url + "/#episodes")
        wait_for(driver, "return document.body.dataset.episodesLoaded >= '1'")
        loaded = driver.execute_script("return document.body.dataset.episodesLoaded")
        driver.execute_script("const s = document.querySelector('[name=groups]'); s.value = 'dropped';"
                              "s.dispatchEvent(new Event('change', {bubbles: true}))")
        wait_for(driver, f"return document.body.dataset.episodesLoaded !== '{loaded}'")
        dropped = [i for i, r in enumerate(recs) if r.get("dropped")]
        assert f"of {len(dropped)} (" in driver.find_element(By.ID, "count").text
        driver.find_element(By.CSS_SELECTOR, f'#episodes tbody tr[data-i="{dropped[0]}"] td a').click()
        wait_for(driver, "return document.body.dataset.groupLoaded === '2'")
        assert "dropped (filtered): not trained" in driver.find_element(By.CSS_SELECTOR, "#group .meta").text
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()


def test_the_run_hands_the_writer_the_groups_it_dropped():
    """The producer keeps the groups dynamic_filter drops (only once asked: a run that writes rollouts) and
    hands them over once; the buffer's batch carries the groups it dropped as stale beside their ids."""
    import asyncio

    from agentrl.rollout.pool import Producer
    from agentrl.run.buffer import StalenessBuffer
    from test_buffer import make_group
    from test_learning_signal import ScriptedPool

    async def produce(keep: bool):
        buffer = StalenessBuffer(batch_size=4, group_size=2, max_staleness=1)
        producer = Producer(buffer, ScriptedPool(lambda p: [0.0, 1.0] if p % 3 == 2 else [1.0, 1.0]),
                            lambda p: {"id": f"t{p}"}, 2, True)
        producer.filtered = [] if keep else None
        task = asyncio.create_task(producer.run())
        try:
            batch = await asyncio.wait_for(buffer.get_batch(0), 10)
        finally:
            await producer.stop()
            task.cancel()
        return producer, batch

    producer, batch = asyncio.run(produce(True))
    dropped = producer.take_filtered()
    assert [g.group_id for g in batch.groups] == [2, 5] and {0, 1, 3, 4} <= {g.group_id for g in dropped}
    assert all(g.group_id % 3 != 2 for g in dropped) and producer.take_filtered() == []
    producer, _ = asyncio.run(produce(False))
    assert producer.filtered is None and producer.take_filtered() == []

    async def stale():
        buf = StalenessBuffer(batch_size=2, group_size=2, max_staleness=1)
        await buf.admit()
        await buf.admit()
        buf.put(make_group(10, [0, 2], [2]))  # stale at V=2
        buf.put(make_group(11, [1, 2], [2]))
        return await buf.get_batch(2)

    batch = asyncio.run(stale())
    assert batch.dropped_ids == [10] and [g.group_id for g in batch.dropped_groups] == [10]
