"""The run viewer's overview curves (the held-out score from the warm start's, constant curves folded) and run
against run (`python -m agentrl.view RUN_A RUN_B`: curves overlaid, the config keys that differ, a held-out
task as both runs answered it), over synthetic run folders written by the run's own writers
(tests/viewer_run.py), in the API and in headless chromium."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentrl.rollout.records import read_records
from agentrl.telemetry.viewer_runs import config_diff, flatten
from test_viewer import Served, chromium, choose, wait_for
from viewer_run import make_run

CONFIG = {"train": {"steps": 6, "loggers": ["jsonl"]}, "buffer": {"max_staleness": 2, "batch_size": 16},
          "algo": {"lr": 1e-6, "trust_region": {"type": "clip", "eps": 0.2}}}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runs")
    other = json.loads(json.dumps(CONFIG))
    other["buffer"]["max_staleness"] = 4
    return make_run(root / "stale2", config=CONFIG), make_run(root / "stale4", seed=1, config=other)


@pytest.fixture(scope="module")
def served(two_runs):
    s = Served(*two_runs)
    yield s
    s.close()


def test_config_diff_lists_the_dotted_keys_that_differ():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": {}}) == {"a.b": 1, "a.c": [1, 2], "d": {}}
    got = config_diff([{"a": {"b": 1, "c": [1, 2]}, "x": 1}, {"a": {"b": 2, "c": [1, 2]}, "y": None}])
    assert got == [{"key": "a.b", "values": [1, 2]}, {"key": "x", "values": [1, "(absent)"]},
                   {"key": "y", "values": ["(absent)", None]}]
    assert config_diff([CONFIG, CONFIG]) == []


def test_two_runs_in_the_api(served, two_runs):
    got = served.get("/api/runs").json()
    assert got["names"] == ["stale2", "stale4"]
    assert got["config_diff"] == [{"key": "buffer.max_staleness", "values": [2, 4]}]
    evals = [read_records(r / "eval_episodes.jsonl") for r in two_runs]
    assert [t["task_id"] for t in got["tasks"]] == [f"task--{i}" for i in range(1, 6)]
    for k, recs in enumerate(evals):
        assert [(t["runs"][k]["before"]["reward"], t["runs"][k]["after"]["reward"]) for t in got["tasks"]] == [
            (recs[i]["reward"], recs[i + 5]["reward"]) for i in range(5)]
    task = served.get("/api/runs/task", task="task--3").json()["runs"]
    assert [(r["before"]["tokens"], r["after"]["tokens"]) for r in task] == [
        (recs[2]["tokens"], recs[7]["tokens"]) for recs in evals]
    assert served.get("/api/runs/task", task="nope").status_code == 404
    # every other call takes the run it asks of
    trained = [read_records(r / "rollouts.jsonl") for r in two_runs]
    for k in (0, 1):
        assert served.get("/api/run", run=str(k)).json()["name"] == two_runs[k].name
        assert served.get("/api/episode", i="3", run=str(k)).json()["tokens"] == trained[k][3]["tokens"]
    bad = served.get("/api/episodes", run="2")
    assert bad.status_code == 400 and bad.text.startswith("run=2")


def test_the_warm_start_score_comes_from_the_summary_or_the_eval_episodes(tmp_path):
    run = make_run(tmp_path / "run")
    s = Served(run)
    try:
        assert s.get("/api/run").json()["eval_scores"] == {"before": 0.1, "after": 0.4}  # summary.json's
        (run / "summary.json").unlink()  # a run still going: the eval episodes' mean over finished ones
        evals = read_records(run / "eval_episodes.jsonl")
        mean = lambda label: (lambda r: sum(r) / len(r))(  # noqa: E731
            [e["reward"] for e in evals if e["eval"] == label and e["status"] in ("ok", "truncated")])
        got = s.get("/api/run").json()["eval_scores"]
        assert got == pytest.approx({"before": mean("before"), "after": mean("after")}, abs=1e-12)
    finally:
        s.close()


def test_the_command_line_takes_two_runs(tmp_path, capsys):
    from agentrl.view import main

    assert main([str(tmp_path), str(tmp_path), str(tmp_path)]) == 2
    assert "give one, or two" in capsys.readouterr().err
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.jsonl").write_text("")
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "b has no metrics.jsonl" in capsys.readouterr().err


def titles(driver, key: str, run: int = 0) -> list[str]:
    from selenium.webdriver.common.by import By

    return [t.get_attribute("textContent") for t in
            driver.find_elements(By.CSS_SELECTOR, f'svg[data-key="{key}"] circle.pt[data-run="{run}"] title')]


def test_the_overview_in_chromium(two_runs, tmp_path):
    """One run: the held-out curve starts at the warm start's score and ends at the score after RL; a
    constant curve folds to one line that opens to its chart."""
    from selenium.webdriver.common.by import By

    metrics = [json.loads(line) for line in (two_runs[0] / "metrics.jsonl").read_text().splitlines()]
    s = Served(two_runs[0])
    driver = chromium()
    try:
        driver.get(s.url + "/#overview")
        wait_for(driver, "return document.body.dataset.ready === '1'")
        evals = [(m["step"], m["eval_score"]) for m in metrics if "eval_score" in m]
        assert titles(driver, "eval_score") == (
            ["before RL (the warm start): 0.1000"]
            + [f"after update {st + 1} (step {st}): {v:.4f}" for st, v in evals] + ["after RL: 0.4000"])
        folded = driver.find_element(By.CSS_SELECTOR, 'details.folded[data-key="tools/calls_per_turn"]')
        assert folded.get_attribute("open") is None and "constant: 0 · 6 pts" in folded.text
        assert not driver.find_element(By.CSS_SELECTOR, 'svg[data-key="tools/calls_per_turn"]').is_displayed()
        folded.find_element(By.TAG_NAME, "summary").click()
        assert driver.find_element(By.CSS_SELECTOR, 'svg[data-key="tools/calls_per_turn"]').is_displayed()
        assert not driver.find_elements(By.CSS_SELECTOR, 'details.folded[data-key="reward_mean"]')
        assert not driver.find_element(By.CSS_SELECTOR, 'a[data-view="runs"]').is_displayed()  # one run: no run vs run
        driver.save_screenshot(str(Path(os.environ.get("AGENTRL_VIEWER_SHOTS", tmp_path)) / "viewer-folded.png"))
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()
        s.close()


def test_run_against_run_in_chromium(served, two_runs, tmp_path):
    from selenium.webdriver.common.by import By

    shots = Path(os.environ.get("AGENTRL_VIEWER_SHOTS", tmp_path))
    metrics = [[json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()] for r in two_runs]
    driver = chromium()
    try:
        driver.get(served.url + "/#overview")
        wait_for(driver, "return document.body.dataset.ready === '1'")
        for k in (0, 1):  # both runs' curves on one axis, in two colours, named in the legend
            assert titles(driver, "reward_mean", k) == [f"{two_runs[k].name}: step {m['step']}: {m['reward_mean']:.4f}"
                                                         for m in metrics[k]]
        lines = driver.find_elements(By.CSS_SELECTOR, 'svg[data-key="reward_mean"] polyline')
        assert len({line.get_attribute("stroke") for line in lines}) == 2
        legend = driver.find_element(By.CSS_SELECTOR, '.chart[data-key="reward_mean"] h3').text
        assert "stale2" in legend and "stale4" in legend
        driver.save_screenshot(str(shots / "viewer-runs-overview.png"))

        driver.find_element(By.CSS_SELECTOR, 'a[data-view="runs"]').click()
        wait_for(driver, "return document.body.dataset.runsLoaded >= '1'")
        rows = driver.find_elements(By.CSS_SELECTOR, "#config-diff tbody tr")
        assert [r.text for r in rows] == ["buffer.max_staleness 2 4"]
        driver.find_element(By.CSS_SELECTOR, '#runs-tasks tbody tr[data-task="task--2"]').click()
        wait_for(driver, "return document.querySelectorAll('#runs-pair .ledger').length === 4")
        evals = [read_records(r / "eval_episodes.jsonl") for r in two_runs]
        sides = driver.find_elements(By.CSS_SELECTOR, "#runs-pair .run-col")
        assert [[len(a.find_elements(By.CSS_SELECTOR, ".tk")) for a in side.find_elements(By.CSS_SELECTOR, ".answer")]
                for side in sides] == [[len(e[1]["tokens"]), len(e[6]["tokens"])] for e in evals]
        driver.save_screenshot(str(shots / "viewer-runs.png"))

        # the header's run picker: the episode list is the second run's
        driver.get(served.url + "/#episodes")
        wait_for(driver, "return document.body.dataset.episodesLoaded >= '1'")
        loaded = driver.execute_script("return document.body.dataset.episodesLoaded")
        choose(driver, "run-pick", "1")
        wait_for(driver, f"return document.body.dataset.episodesLoaded !== '{loaded}'")
        trained = read_records(two_runs[1] / "rollouts.jsonl")
        first = driver.find_element(By.CSS_SELECTOR, "#episodes tbody tr td:nth-child(5)").text
        assert float(first) == pytest.approx(trained[0]["reward"], abs=1e-3)
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()
