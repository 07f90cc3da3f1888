"""The screenshots of docs/viewer.md, from a real run's folder, in headless chromium (the project's scripts
install it with chromium-driver):

    python docs/viewer_shots.py RUN_DIR [--out docs/images]

Overview; the episodes filtered to status ok; one trained episode of at least two turns coloured by pi - mu
(the one with the largest gap) with a generated token hovered; before / after on a held-out task the trained model answered better.
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


def shoot(run: Path, out: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    url = asyncio.run_coroutine_threadsafe(Viewer(run).start("127.0.0.1", 0), loop).result(30)
    wait = lambda d, js: WebDriverWait(d, 30).until(lambda x: x.execute_script(js))  # noqa: E731
    recs = read_records(run / "rollouts.jsonl")
    gap = lambda r: max(abs(p - m) for p, m, k in zip(r["learner_logprobs"], r["logprobs"], r["loss_mask"]) if k)  # noqa: E731
    pick = max((i for i, r in enumerate(recs) if "learner_logprobs" in r and len(r["turns"]) >= 2 and r["reward"] > 0),
               key=lambda i: gap(recs[i]))  # the trained episode the learner had moved furthest from
    driver = chromium()
    try:
        driver.get(url + "/#overview")
        wait(driver, "return document.body.dataset.ready === '1'")
        driver.save_screenshot(str(out / "viewer-overview.png"))
        driver.get(url + "/#episodes")
        wait(driver, "return document.body.dataset.episodesLoaded >= '1'")
        driver.save_screenshot(str(out / "viewer-episodes.png"))
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
    finally:
        driver.quit()
        loop.call_soon_threadsafe(loop.stop)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "images")
    a = ap.parse_args()
    shoot(a.run_dir, a.out)
    print(f"wrote viewer-overview/episodes/episode/compare.png to {a.out}")


if __name__ == "__main__":
    main()
