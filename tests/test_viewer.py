"""`python -m agentrl.view`: the JSON API over a run folder's real files (written by the run's own
writers, tests/viewer_run.py) on a real aiohttp server on loopback, and the page in Debian's chromium,
driven headless by selenium: curves, filters, one episode token by token, before/after."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shutil
import threading
from pathlib import Path

import httpx
import pytest
import torch

from agentrl.config import load_config
from agentrl.rollout.records import RolloutWriter, read_records
from agentrl.telemetry.viewer import Viewer, _loopback
from agentrl.types import Episode, TrainBatch
from viewer_run import decode, episode, make_run


class Served:
    """A Viewer on its own event loop in a thread, so the test (and the browser) talk to it over HTTP."""

    def __init__(self, run_dir: Path, *others: Path) -> None:
        """`others`: more run folders, shown against the first (run against run)."""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.viewer = Viewer(run_dir, *others)
        self.url = asyncio.run_coroutine_threadsafe(self.viewer.start("127.0.0.1", 0), self.loop).result(30)
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(30.0))

    def get(self, path: str, **params) -> httpx.Response:
        return self.http.get(path, params=params)

    def close(self) -> None:
        self.http.close()
        asyncio.run_coroutine_threadsafe(self.viewer.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("viewer") / "run")


@pytest.fixture(scope="module")
def served(run_dir):
    s = Served(run_dir)
    yield s
    s.close()


def records(run_dir: Path, name: str = "rollouts.jsonl") -> list[dict]:
    return read_records(run_dir / name)


def test_filters_count_what_the_file_holds(served, run_dir):
    recs = records(run_dir)
    assert len(recs) == 6 * 4 * 4
    every = served.get("/api/episodes", limit=500).json()
    assert every["total"] == every["all"] == len(recs)
    assert every["statuses"] == {s: sum(r["status"] == s for r in recs) for s in {r["status"] for r in recs}}
    got = served.get("/api/episodes", status="env_error,timeout", reward_min="-0.5", turns_min="2",
                     limit=500).json()
    want = [i for i, r in enumerate(recs) if r["status"] in ("env_error", "timeout") and r["reward"] >= -0.5
            and len(r["turns"]) >= 2]
    assert [row["i"] for row in got["rows"]] == want and got["total"] == len(want) > 0
    stale = served.get("/api/episodes", staleness_min="2", limit=500).json()
    oldest = [r["step"] - min(v for v, m in zip(r["versions"], r["loss_mask"]) if m) for r in recs]
    assert [row["i"] for row in stale["rows"]] == [i for i, s in enumerate(oldest) if s >= 2]
    calls = served.get("/api/episodes", tool_calls_min="1", tool_calls_max="1", group_min="5", group_max="5").json()
    assert [row["i"] for row in calls["rows"]] == [i for i, r in enumerate(recs)
                                                  if r["info"]["tool_calls"] == 1 and r["group_id"] == 5]
    searched = served.get("/api/episodes", q="TASK-7 ").json()  # a task id, any case
    assert {row["task_id"] for row in searched["rows"]} == {"task-7"} and searched["total"] == 4
    assert served.get("/api/episodes", q="apples", limit=500).json()["total"] == len(recs)  # the text


def test_paging_and_bad_parameters(served, run_dir):
    n = len(records(run_dir))
    pages = [served.get("/api/episodes", offset=str(o), limit="7").json() for o in range(0, n, 7)]
    assert [row["i"] for p in pages for row in p["rows"]] == list(range(n))
    assert all(p["total"] == n for p in pages)
    bad = served.get("/api/episodes", reward_min="high")
    assert bad.status_code == 400 and "reward_min='high' is not a number" in bad.text
    assert served.get("/api/episodes", limit="100000").status_code == 400
    assert served.get("/api/episodes", source="secrets").status_code == 404


def test_one_episode_is_its_record_with_staleness(served, run_dir):
    recs = records(run_dir)
    got = served.get("/api/episode", source="train", i="37").json()
    want = recs[37]
    for key in ("tokens", "loss_mask", "logprobs", "versions", "turns", "messages", "reward", "status"):
        assert got[key] == want[key], key
    assert got["token_text"] == decode(want["tokens"])
    assert got["staleness"] == [want["step"] - v if m else None for v, m in zip(want["versions"], want["loss_mask"])]
    assert served.get("/api/episode", i="9999").status_code == 404
    for i in ("-1", "x", "²"):  # not an index: the parameter is named
        bad = served.get("/api/episode", i=i)
        assert bad.status_code == 400 and bad.text == f"i={i!r} is not a whole number >= 0"


def test_paths_stay_inside_the_run_folder(served, run_dir, tmp_path):
    assert served.get("/static/app.js").status_code == 200
    for path in ("/static/../summary.json", "/static/%2e%2e%2fmetrics.jsonl", "/static/..%2f..%2fpyproject.toml",
                 "/metrics.jsonl", "/static/viewer.py", "/static/"):
        assert served.http.get(path).status_code == 404, path
    raw = httpx.get(served.url + "/static/../../../../etc/passwd")  # httpx keeps the dots as sent
    assert raw.status_code == 404
    rebound = served.http.get("/api/run", headers={"Host": "evil.example:80"})  # DNS rebinding
    assert rebound.status_code == 403 and "run" not in rebound.text.split()
    assert served.http.get("/api/run", headers={"Host": "localhost"}).status_code == 200
    # A file of the run that is a link out of the folder is not read.
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"step": 0, "loss": 1.0}) + "\n")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "metrics.jsonl").symlink_to(secret)
    s = Served(linked)
    try:
        assert s.get("/api/metrics").json() == {"total": 0, "rows": []}
    finally:
        s.close()


def test_it_follows_a_growing_run(tmp_path):
    run = make_run(tmp_path / "run", steps=2, groups=1, samples=2, evals=False)
    s = Served(run)
    try:
        assert s.get("/api/metrics").json()["total"] == 2
        assert s.get("/api/run").json()["summary"]["eval_after"]["score"] == 0.4
        with open(run / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": 2, "reward_mean": 0.5}) + "\n" + '{"step": 3, "rew')  # a torn line
        got = s.get("/api/metrics", since="2").json()
        assert got == {"total": 3, "rows": [{"step": 2, "reward_mean": 0.5}]}
        with open(run / "metrics.jsonl", "a") as f:
            f.write('ard_mean": 0.75}\n')  # the writer finishes the line
        assert s.get("/api/metrics", since="3").json()["rows"] == [{"step": 3, "reward_mean": 0.75}]
        before = s.get("/api/episodes").json()["total"]
        writer = RolloutWriter(run / "rollouts.jsonl", start_step=2, decode=decode)
        import random
        from agentrl.types import Group

        writer.write(2, [Group(9, {"id": "task-9"}, [episode(random.Random(1), 2, 9, 0, 3)])])
        writer.close()
        assert s.get("/api/episodes").json()["total"] == before + 1
        assert s.get("/api/episodes", q="task-9").json()["rows"][0]["turns"] == 3
        (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward_mean": 1.0}) + "\n")  # a restart
        assert s.get("/api/metrics").json() == {"total": 1, "rows": [{"step": 0, "reward_mean": 1.0}]}
    finally:
        s.close()


def test_before_after_pairs_the_first_and_last_eval(served, run_dir):
    evals = records(run_dir, "eval_episodes.jsonl")
    got = served.get("/api/compare").json()["tasks"]
    assert [(p["task_id"], p["before"]["eval"], p["after"]["eval"]) for p in got] == [
        (f"task--{i}", "before", "after") for i in range(1, 6)]
    pair = served.get("/api/compare", task="task--3").json()
    assert pair["before"]["tokens"] == evals[2]["tokens"] and pair["after"]["tokens"] == evals[7]["tokens"]
    assert served.get("/api/compare", task="nope").status_code == 404


def test_the_config_key_samples_groups_and_stops_at_the_cap(tmp_path, caplog):
    assert load_config(None, ["train.save_rollouts=true"]).train.save_rollouts.sample_groups == "all"
    off = load_config(None, ["train.save_rollouts=false"]).train.save_rollouts
    assert (off.sample_groups, off.eval) == (0, False)
    default = load_config(None, []).train.save_rollouts
    assert (default.sample_groups, default.max_mb, default.eval) == (4, 200.0, True)
    import random
    from agentrl.types import Group

    rng = random.Random(0)
    groups = [Group(g, {"id": g}, [episode(rng, 0, g, s, 1) for s in range(2)]) for g in range(10)]
    path = tmp_path / "rollouts.jsonl"
    with caplog.at_level(logging.INFO, logger="agentrl.rollout.records"):
        writer = RolloutWriter(path, sample_groups=3, max_bytes=40_000, seed=7)
        for step in range(20):
            writer.write(step, groups)
        writer.close()
    recs = read_records(path)
    by_step = {}
    for r in recs:
        by_step.setdefault(r["step"], set()).add(r["group_id"])
    assert all(len(ids) == 3 for ids in by_step.values())  # 3 whole groups a step
    assert len({frozenset(ids) for ids in by_step.values()}) > 1  # drawn, not the first three every time
    assert path.stat().st_size <= 40_000 and 1 < len(by_step) < 20
    assert sum("the cap of train.save_rollouts.max_mb" in r.message for r in caplog.records) == 1


def test_loopback_and_the_command_line(tmp_path, capsys):
    assert _loopback("127.0.0.1") and _loopback("::1") and _loopback("localhost")
    assert not _loopback("0.0.0.0") and not _loopback("10.1.2.3")
    from agentrl.view import main

    assert main([str(tmp_path)]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err


BAD_ROWS = [b'{"step": 3, "rew', b"[1, 2]", b'"a string"', b'{"turns": 5}', b'{"step": "3"}', b'{"eval": ["x"]}',
            b'{"versions": ["a"], "loss_mask": [1]}', b'{"loss_mask": "11"}', b'{"group_id": true}', b"\xff\xfe{}",
            b"[" * 100_000]  # a torn line, not objects, fields of other types, not UTF-8, nested past the parser


def test_bad_rows_are_skipped_and_counted_and_the_rest_is_read(tmp_path):
    """Rows that are not what the run's writers write are skipped and counted (bad_rows), the rows after
    them in the same read are served, and filters, pages and before/after still answer; a last line
    without its newline is waited for, not counted."""
    run = make_run(tmp_path / "run", steps=2, groups=1, samples=2)
    s = Served(run)
    try:
        before = s.get("/api/episodes").json()
        assert before["bad_rows"] == 0 and s.get("/api/run").json()["bad_rows"] == {
            "metrics.jsonl": 0, "rollouts.jsonl": 0, "eval_episodes.jsonl": 0}
        good = json.loads((run / "rollouts.jsonl").read_bytes().splitlines()[0])
        row = lambda task: json.dumps({**good, "task_id": task}).encode()  # noqa: E731
        with open(run / "rollouts.jsonl", "ab") as f:
            f.write(b"\n".join([row("after-0"), *BAD_ROWS, b"", row("after-1")]) + b"\n" + row("after-2")[:40])
        with open(run / "metrics.jsonl", "ab") as f:
            f.write(b'not json\n{"step": 2, "reward_mean": 0.5}\n')
        got = s.get("/api/episodes", limit=500).json()
        assert [r["task_id"] for r in got["rows"][-2:]] == ["after-0", "after-1"]
        assert got["all"] == before["all"] + 2 and got["bad_rows"] == len(BAD_ROWS)
        assert s.get("/api/run").json()["bad_rows"] == {"metrics.jsonl": 1, "rollouts.jsonl": len(BAD_ROWS),
                                                        "eval_episodes.jsonl": 0}
        assert s.get("/api/metrics", since="2").json()["rows"] == [{"step": 2, "reward_mean": 0.5}]
        for params in ({"step_min": "0"}, {"group_min": "0", "staleness_max": "9"}, {"q": "after"}):
            assert s.get("/api/episodes", **params).status_code == 200, params
        assert s.get("/api/episode", i=str(got["all"] - 1)).json()["task_id"] == "after-1"
        assert s.get("/api/compare").status_code == 200
        with open(run / "rollouts.jsonl", "ab") as f:  # the writer finishes its line
            f.write(row("after-2")[40:] + b"\n")
        done = s.get("/api/episodes", q="after-2").json()
        assert done["total"] == 1 and done["bad_rows"] == len(BAD_ROWS)
        (run / "rollouts.jsonl").write_bytes(row("fresh") + b"\n")  # a restart: earlier rows and counts are void
        assert s.get("/api/episodes").json()["bad_rows"] == 0
    finally:
        s.close()


@pytest.mark.parametrize("path, key, value", [
    ("/api/metrics", "since", "nan"), ("/api/metrics", "since", "abc"), ("/api/metrics", "since", "-1"),
    ("/api/metrics", "since", "inf"), ("/api/metrics", "since", "1.5"),
    ("/api/episodes", "reward_min", "nan"), ("/api/episodes", "reward_max", "inf"),
    ("/api/episodes", "turns_min", "-inf"), ("/api/episodes", "step_max", "1e999"),
    ("/api/episodes", "offset", "-1"), ("/api/episodes", "offset", "nan"), ("/api/episodes", "limit", "0"),
    ("/api/episodes", "limit", "1e3"), ("/api/episodes", "limit", "abc"), ("/api/episode", "i", "nan")])
def test_a_bad_number_in_the_query_is_a_400_naming_it(served, path, key, value):
    got = served.get(path, **{key: value})
    assert got.status_code == 400 and got.text.startswith(f"{key}="), got.text


def test_good_numbers_still_answer(served):
    assert served.get("/api/metrics", since="0").status_code == 200
    assert served.get("/api/episodes", reward_min="-1.5", reward_max="2e0", offset="0", limit="500").status_code == 200


# ---- the page, in a real browser ------------------------------------------------------------------

def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)


def choose(driver, control: str, value: str, timeout: float = 30.0) -> None:
    """Select `value` in the <select id=control> and wait until the page holds it: the episode view may
    draw its controls again after its tokens appear, and an element found before that is stale."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    def chosen(d) -> bool:
        try:
            Select(d.find_element(By.ID, control)).select_by_value(value)
            return d.execute_script(f"return document.getElementById('{control}').value") == value
        except StaleElementReferenceException:
            return False

    WebDriverWait(driver, timeout, poll_frequency=0.1).until(chosen)


def wait_for(driver, script: str, timeout: float = 30.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: d.execute_script(script))


def test_the_page_in_chromium(served, run_dir, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    shots = Path(os.environ.get("AGENTRL_VIEWER_SHOTS", tmp_path))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    recs = records(run_dir)
    driver = chromium()
    try:
        driver.get(served.url + "/#overview")
        wait_for(driver, "return document.body.dataset.ready === '1'")
        for key in ("reward_mean", "success_rate", "policy/trust_masked_frac", "push_pause_s"):
            points = driver.find_elements(By.CSS_SELECTOR, f'svg[data-key="{key}"] circle.pt')
            assert len(points) == len(metrics), key
        first = driver.find_element(By.CSS_SELECTOR, 'svg[data-key="reward_mean"] circle.pt title')
        assert first.get_attribute("textContent") == f"step 0: {metrics[0]['reward_mean']:.4f}"
        driver.save_screenshot(str(shots / "viewer-overview.png"))

        driver.get(served.url + "/#episodes")
        wait_for(driver, "return document.body.dataset.episodesLoaded >= '1'")
        loaded = driver.execute_script("return document.body.dataset.episodesLoaded")
        driver.find_element(By.CSS_SELECTOR, '#status-boxes input[value="timeout"]').click()
        wait_for(driver, f"return document.body.dataset.episodesLoaded !== '{loaded}'")
        timeouts = [i for i, r in enumerate(recs) if r["status"] == "timeout"]
        shown = driver.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")
        assert [int(tr.get_attribute("data-i")) for tr in shown] == timeouts[:50]
        assert {tr.find_elements(By.TAG_NAME, "td")[3].text for tr in shown} == {"timeout"}
        assert f"of {len(timeouts)} ({len(recs)} recorded)" in driver.find_element(By.ID, "count").text
        driver.save_screenshot(str(shots / "viewer-episodes.png"))

        pick = next(i for i in timeouts if len(recs[i]["turns"]) >= 3)
        driver.find_element(By.CSS_SELECTOR, f'#episodes tbody tr[data-i="{pick}"]').click()
        wait_for(driver, "return document.querySelectorAll('#episode .ledger .tk').length > 0")
        rec = recs[pick]
        tokens = driver.find_elements(By.CSS_SELECTOR, "#episode .ledger .tk")
        assert [t.text for t in tokens] == decode(rec["tokens"])  # white space kept (pre-wrap)
        assert len(driver.find_elements(By.CSS_SELECTOR, "#episode .ledger .tk.gen")) == sum(rec["loss_mask"])
        assert len(driver.find_elements(By.CSS_SELECTOR, "#episode .ledger .turn")) == len(rec["turns"])
        assert [m.text.split("\n", 1)[1] for m in driver.find_elements(By.CSS_SELECTOR, "#episode .msg")] == [
            m["content"] for m in rec["messages"]]
        gen = rec["turns"][1]["start"] + 1
        token = driver.find_element(By.CSS_SELECTOR, f'.ledger .tk[data-i="{gen}"]')
        ActionChains(driver).move_to_element(token).perform()
        tip = driver.find_element(By.ID, "tip")
        wait_for(driver, f"return document.getElementById('tip').dataset.i === '{gen}'")
        assert f"behaviour log-prob μ: {rec['logprobs'][gen]:.4f}" in tip.text
        assert f"version {rec['versions'][gen]}  staleness {rec['step'] - rec['versions'][gen]}" in tip.text
        colour = token.value_of_css_property("background-color")
        assert colour not in ("rgba(0, 0, 0, 0)", "transparent")  # a generated token is coloured
        # A trained episode: the learner's values beside it, coloured by pi - mu and shown on hover.
        pick = next(i for i, r in enumerate(recs) if "advantages" in r and len(r["turns"]) >= 2)
        rec, gen = recs[pick], recs[pick]["turns"][1]["start"]
        driver.get(served.url + f"/#episode/train/{pick}")
        wait_for(driver, "return document.querySelectorAll('#episode .ledger .tk').length > 0")
        choose(driver, "colour-by", "pimu")
        token = driver.find_element(By.CSS_SELECTOR, f'.ledger .tk[data-i="{gen}"]')
        assert token.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "transparent")
        ActionChains(driver).move_to_element(token).perform()
        wait_for(driver, f"return document.getElementById('tip').dataset.i === '{gen}'")
        tip = driver.find_element(By.ID, "tip").text
        gap = rec["learner_logprobs"][gen] - rec["logprobs"][gen]
        assert f"π − μ (learner − behaviour log-prob): {gap:.4f}" in tip
        assert f"advantage {rec['advantages'][gen]:.4f}  learner π {rec['learner_logprobs'][gen]:.4f}" in tip
        driver.save_screenshot(str(shots / "viewer-episode.png"))
        # The trust region's decision: a masked-out token stands out from a kept one, in the legend's count
        # and on hover.
        pick = next(i for i, r in enumerate(recs) if 0 in r.get("trust_kept", []) and 1 in r["trust_kept"])
        rec = recs[pick]
        driver.get(served.url + f"/#episode/train/{pick}")
        wait_for(driver, "return document.querySelectorAll('#episode .ledger .tk').length > 0")
        choose(driver, "colour-by", "trust")
        scored = [k for k in rec["trust_kept"] if k is not None]
        legend = " ".join(x.text for x in driver.find_elements(By.CSS_SELECTOR, "#episode .legend"))
        assert f"{scored.count(0)} of {len(scored)} trained tokens masked out" in legend
        out, kept = rec["trust_kept"].index(0), rec["trust_kept"].index(1)
        colours = {i: driver.find_element(By.CSS_SELECTOR, f'.ledger .tk[data-i="{i}"]')
                   .value_of_css_property("background-color") for i in (out, kept)}
        assert colours[out] != colours[kept] and "rgba(0, 0, 0, 0)" not in colours.values()
        ActionChains(driver).move_to_element(
            driver.find_element(By.CSS_SELECTOR, f'.ledger .tk[data-i="{out}"]')).perform()
        wait_for(driver, f"return document.getElementById('tip').dataset.i === '{out}'")
        assert "trust region: masked out" in driver.find_element(By.ID, "tip").text

        driver.get(served.url + "/#compare/task--2")
        wait_for(driver, "return document.querySelectorAll('#compare-pair .ledger').length === 2")
        evals = records(run_dir, "eval_episodes.jsonl")
        sides = driver.find_elements(By.CSS_SELECTOR, "#compare-pair .ledger")
        assert [len(s.find_elements(By.CSS_SELECTOR, ".tk")) for s in sides] == [len(evals[1]["tokens"]),
                                                                                 len(evals[6]["tokens"])]
        assert not math.isnan(float(driver.find_elements(By.CSS_SELECTOR, "#compare-list tbody tr")[1]
                                    .find_elements(By.TAG_NAME, "td")[2].text.split()[0]))
        driver.save_screenshot(str(shots / "viewer-compare.png"))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
    finally:
        driver.quit()


def test_learner_values_follow_the_batch_rows():
    """`learner_values` maps the learner's (B, T) rows back to episodes as `TrainBatch.from_episodes` laid
    them out: an episode with a closed segment owns two rows and its record gets the second (its current
    ledger); unscored positions are None; values rounded to 4 decimals."""
    from agentrl.rollout.records import learner_values

    a = Episode(task_id="a", group_id=0)
    a.append([1, 2], generated=False)
    a.append([3, 4], generated=True, logprobs=[-1.0, -2.0], versions=[0, 0])
    b = Episode(task_id="b", group_id=0)
    b.append([5, 6, 7], generated=True, logprobs=[-1.0] * 3, versions=[0] * 3)
    b.start_segment("rewritten")
    b.append([8], generated=False)
    b.append([9], generated=True, logprobs=[-0.5], versions=[1])
    batch = TrainBatch.from_episodes([a, b], None, pad_id=0)
    assert batch.size == 3
    adv = torch.tensor([[0.0, 0.0, 1.23456, 1.23456], [9.0, 9.0, 9.0, 0.0], [0.0, -0.5, 0.0, 0.0]])
    out = learner_values([a, b], {"advantages": adv, "learner_logprobs": None})
    assert out == {id(a): {"advantages": [None, None, 1.2346, 1.2346]}, id(b): {"advantages": [None, -0.5]}}


def test_a_running_run_shows_its_config(tmp_path):
    """Before summary.json exists, the page's config comes from run_config.json, which the run's sink writes
    when training starts (the same dump summary.json gets, secrets masked: tests/test_secrets.py)."""
    from agentrl.telemetry.metrics import MetricsSink

    cfg = load_config(None, [f"train.out_dir={tmp_path / 'run'}"])
    sink = MetricsSink(tmp_path / "run", 5, show=False, run_config=cfg.model_dump())
    sink.log({"step": 0, "reward_mean": 0.25})
    s = Served(tmp_path / "run")
    try:
        got = s.get("/api/run").json()
        assert got["summary"] is None and got["config"]["train"]["steps"] == cfg.train.steps
        assert got["config"]["train"]["out_dir"] == str(tmp_path / "run")
    finally:
        s.close()
        sink.close()
