"""The screenshots of docs/viewer.md, from a real run's folder, in headless chromium (the project's scripts
install it with chromium-driver):

    python docs/viewer_shots.py RUN_DIR [OTHER_RUN] [--out docs/images] [--views overview,group,...]

Overview; the episodes filtered to status ok; one trained episode of at least two turns coloured by pi - mu
(the one with the largest gap) with a generated token hovered; before / after on a held-out task the trained model answered better;
the group with the widest spread of rewards, its ledgers coloured by advantage; the trained episode with the most tokens
masked, coloured by the cause of each token's training, a masked token hovered; with OTHER_RUN, run against run: the
overlaid curves, and the config diff with a held-out task the two runs answered differently.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import threading
from pathlib import Path
from urllib.parse import quote

import httpx

from agentrl.rollout.records import read_records
from agentrl.telemetry.viewer import Viewer


def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)


VIEWS = ("overview", "episodes", "episode", "compare", "group", "causes", "runs")


def shoot(run: Path, out: Path, other: Path | None = None, views: tuple[str, ...] = VIEWS) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    url = asyncio.run_coroutine_threadsafe(Viewer(run).start("127.0.0.1", 0), loop).result(30)
    pair = asyncio.run_coroutine_threadsafe(Viewer(run, other).start("127.0.0.1", 0), loop).result(30) if other else None
    wait = lambda d, js: WebDriverWait(d, 30).until(lambda x: x.execute_script(js))  # noqa: E731
    recs = read_records(run / "rollouts.jsonl")
    gap = lambda r: max(abs(p - m) for p, m, k in zip(r["learner_logprobs"], r["logprobs"], r["loss_mask"]) if k)  # noqa: E731
    driver = chromium()
    try:
        if "overview" in views:
            overview_episodes(driver, url, out, wait)
        if "episode" in views or "compare" in views:
            pick = max((i for i, r in enumerate(recs) if "learner_logprobs" in r and len(r["turns"]) >= 2 and r["reward"] > 0),
                       key=lambda i: gap(recs[i]))  # the trained episode the learner had moved furthest from
            episode_compare(driver, url, out, wait, recs, pick)
        if "group" in views:
            group_shot(driver, url, out, wait, recs)
        if "causes" in views:
            causes_shot(driver, url, out, wait, recs)
        if "runs" in views and pair:
            runs_shot(driver, pair, out, wait)
    finally:
        driver.quit()
        loop.call_soon_threadsafe(loop.stop)


def overview_episodes(driver, url: str, out: Path, wait) -> None:
    """The overview, then the episode list."""
    driver.get(url + "/#overview")
    wait(driver, "return document.body.dataset.ready === '1'")
    driver.save_screenshot(str(out / "viewer-overview.png"))
    driver.get(url + "/#episodes")
    wait(driver, "return document.body.dataset.episodesLoaded >= '1'")
    driver.save_screenshot(str(out / "viewer-episodes.png"))


def episode_compare(driver, url: str, out: Path, wait, recs: list[dict], pick: int) -> None:
    """Episode `pick` coloured by pi - mu, a generated token hovered; before / after on a task answered better."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(url + f"/#episode/train/{pick}")
    wait(driver, "return document.querySelectorAll('#episode .ledger .tk').length > 0")
    Select(driver.find_element(By.ID, "colour-by")).select_by_value("pimu")
    gen = recs[pick]["turns"][1]["start"]
    ActionChains(driver).move_to_element(driver.find_element(By.CSS_SELECTOR, f'.ledger .tk[data-i="{gen}"]')).perform()
    wait(driver, f"return document.getElementById('tip').dataset.i === '{gen}'")
    driver.save_screenshot(str(out / "viewer-episode.png"))
    tasks = httpx.get(url + "/api/compare").json()["tasks"]
    task = next((p for p in tasks if p["after"]["reward"] > p["before"]["reward"]), tasks[0])["task_id"]
    driver.get(url + f"/#compare/{quote(task)}")
    wait(driver, "return document.querySelectorAll('#compare-pair .ledger').length === 2")
    Select(driver.find_element(By.CSS_SELECTOR, "#compare-pair #colour-by")).select_by_value("mu")  # evals: no pi
    wait(driver, "return document.querySelectorAll('#compare-pair .ledger').length === 2")
    driver.execute_script("document.getElementById('compare-pair').scrollIntoView()")  # the page shows the list
    driver.save_screenshot(str(out / "viewer-compare.png"))


def group_shot(driver, url: str, out: Path, wait, recs: list[dict]) -> None:
    """The trained group whose rewards spread widest (most samples on a tie)."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(recs):
        if "advantages" in r and not r.get("dropped"):
            groups.setdefault((r["step"], r["group_id"]), []).append(i)
    ids = max(groups.values(), key=lambda g: (max(recs[i]["reward"] for i in g) - min(recs[i]["reward"] for i in g), len(g)))
    driver.get(url + f"/#group/train/{ids[0]}")
    wait(driver, "return document.body.dataset.groupLoaded >= '1'")
    driver.save_screenshot(str(out / "viewer-group.png"))


def causes_shot(driver, url: str, out: Path, wait, recs: list[dict]) -> None:
    """The trained episode with the most tokens the loss did not train as they were, coloured by cause."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    odd = lambda r: sum(1 for c in r.get("cause") or [] if c)  # noqa: E731
    pick = max(range(len(recs)), key=lambda i: (len({c for c in recs[i].get("cause") or [] if c}), odd(recs[i])))
    driver.get(url + f"/#episode/train/{pick}")
    wait(driver, "return document.querySelectorAll('#episode .ledger .tk').length > 0")
    Select(driver.find_element(By.ID, "colour-by")).select_by_value("cause")
    wait(driver, "return document.querySelector('#episode .legend .causes') !== null")
    masked = next((i for i, c in enumerate(recs[pick]["cause"]) if c), None)
    if masked is not None:
        ActionChains(driver).move_to_element(driver.find_element(By.CSS_SELECTOR, f'.ledger .tk[data-i="{masked}"]')).perform()
        wait(driver, f"return document.getElementById('tip').dataset.i === '{masked}'")
    driver.save_screenshot(str(out / "viewer-causes.png"))


def runs_shot(driver, url: str, out: Path, wait) -> None:
    """Both runs' curves overlaid; the config diff and the held-out task whose answers differ most."""
    driver.get(url + "/#overview")
    wait(driver, "return document.body.dataset.ready === '1'")
    driver.save_screenshot(str(out / "viewer-runs-overview.png"))
    tasks = httpx.get(url + "/api/runs").json()["tasks"]
    if not tasks:
        return
    after = lambda t, k: (t["runs"][k]["after"] or {}).get("reward") or 0.0  # noqa: E731
    task = max(tasks, key=lambda t: abs(after(t, 0) - after(t, 1)))["task_id"]
    driver.get(url + f"/#runs/{quote(task)}")
    wait(driver, "return document.querySelectorAll('#runs-pair .ledger').length >= 2")
    driver.save_screenshot(str(out / "viewer-runs.png"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("other_run", type=Path, nargs="?", help="a second run: run against run")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "images")
    ap.add_argument("--views", default=",".join(VIEWS), help=f"which shots, of {','.join(VIEWS)}")
    a = ap.parse_args()
    views = tuple(v for v in a.views.split(",") if v)
    shoot(a.run_dir, a.out, a.other_run, views)
    print(f"wrote the viewer's {', '.join(views)} shots to {a.out}")


if __name__ == "__main__":
    main()
