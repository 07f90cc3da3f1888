"""Why each token was or was not trained, on the page: the learner's `cause` codes beside a trained episode
(tests/viewer_run.py writes them as the loss gives them, `token_causes`) and a dropped group's flag, shown
on hover and as a colouring, in headless chromium."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.algo import TOKEN_CAUSES
from agentrl.rollout.records import read_records
from test_viewer import Served, choose, chromium, wait_for
from viewer_run import make_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("causes") / "run", dropped=True)


def hover(driver, i: int) -> str:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    ActionChains(driver).move_to_element(driver.find_element(By.CSS_SELECTOR, f'#episode .ledger .tk[data-i="{i}"]')).perform()
    wait_for(driver, f"return document.getElementById('tip').dataset.i === '{i}'")
    return driver.find_element(By.ID, "tip").text


def test_the_records_carry_integer_causes(run_dir):
    recs = [r for r in read_records(run_dir / "rollouts.jsonl") if "cause" in r]
    assert recs
    for r in recs:
        assert all((c is None) == (not m) for c, m in zip(r["cause"], r["loss_mask"]))
        assert all(isinstance(c, int) and 0 <= c < len(TOKEN_CAUSES) for c in r["cause"] if c is not None)
        # the trust region's masked tokens are causes 1-3, the rest are not
        assert all((k == 0) == (1 <= c <= 3) for k, c in zip(r["trust_kept"], r["cause"]) if c is not None)
    assert {1, 2, 5} <= {c for r in recs for c in r["cause"] if c is not None}


def test_a_masked_token_says_which_rule_masked_it(run_dir, tmp_path):
    from selenium.webdriver.common.by import By

    recs = read_records(run_dir / "rollouts.jsonl")
    s = Served(run_dir)
    driver = chromium()
    try:
        pick = next(i for i, r in enumerate(recs) if {0, 1, 5} <= set(r.get("cause") or []))
        rec = recs[pick]
        driver.get(s.url + f"/#episode/train/{pick}")
        wait_for(driver, "return document.querySelectorAll('#episode .ledger .tk').length > 0")
        assert driver.execute_script("return CAUSES") == list(TOKEN_CAUSES)  # the page's names are the learner's
        choose(driver, "colour-by", "cause")
        wait_for(driver, "return document.querySelector('#episode .legend .causes') !== null")
        first = {c: rec["cause"].index(c) for c in (0, 1, 5)}
        for code, i in first.items():
            assert f"why: {TOKEN_CAUSES[code]}" in hover(driver, i), code
        colours = {c: driver.find_element(By.CSS_SELECTOR, f'#episode .ledger .tk[data-i="{i}"]')
                   .value_of_css_property("background-color") for c, i in first.items()}
        assert len(set(colours.values())) == 3 and "rgba(0, 0, 0, 0)" not in colours.values()
        legend = driver.find_element(By.CSS_SELECTOR, "#episode .legend .causes").text
        for code in set(c for c in rec["cause"] if c is not None):
            assert f"{TOKEN_CAUSES[code]}: {rec['cause'].count(code)}" in legend
        driver.save_screenshot(str(Path(os.environ.get("AGENTRL_VIEWER_SHOTS", tmp_path)) / "viewer-causes.png"))
        # a group dropped as too stale: every generated token says so, with the episode's staleness
        stale = next(i for i, r in enumerate(recs) if r.get("dropped") == "stale")
        rec = recs[stale]
        driver.get(s.url + f"/#episode/train/{stale}")
        wait_for(driver, f"return document.querySelector('#episode .meta') && "
                         f"document.querySelector('#episode .meta').textContent.includes('{rec['task_id']}')")
        gen = rec["loss_mask"].index(1)
        oldest = rec["step"] - min(v for v, m in zip(rec["versions"], rec["loss_mask"]) if m)
        assert (f"why: not trained: the whole group was dropped as too stale (staleness {oldest} at step "
                f"{rec['step']})") in hover(driver, gen)
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()
        s.close()
