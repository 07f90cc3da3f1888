"""The run viewer on a big run: 10,000 episodes over 200 steps (a synthetic run folder written by the
run's own writers, tests/viewer_run.py), measured in headless chromium with the page's own clock
(performance.now()): the time to open the page (navigation start to the overview drawn) and the time a
filter takes (the request, the server's filtering of all 10,000 and the table drawn). Goals: open < 2 s,
filter < 200 ms.

    python bench/viewer.py [--episodes 10000] [--steps 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, median, print_host, progress, table

sys.path.insert(0, str(ROOT / "tests"))

from test_viewer import Served, chromium, wait_for  # noqa: E402
from viewer_run import make_run  # noqa: E402

FILTERS = {  # what a user does -> the script that does it in the page
    "status: timeout": "document.querySelector('#status-boxes input[value=\"timeout\"]').click()",
    "next page": "document.getElementById('next').click()",
    "status: timeout + ok": "document.querySelector('#status-boxes input[value=\"ok\"]').click()",
    "reward >= 0.5": "const i = document.querySelector('[name=reward_min]'); i.value = '0.5';"
                     "i.dispatchEvent(new Event('change', {bubbles: true}))",
    "search 'task-1234'": "const i = document.querySelector('[name=q]'); i.value = 'task-1234';"
                          "i.dispatchEvent(new Event('change', {bubbles: true}))",
}


def open_once(driver, url: str) -> float:
    driver.get("about:blank")
    driver.get(url + "/#overview")
    wait_for(driver, "return document.body.dataset.ready === '1'")
    return driver.execute_script("return window.viewer.timing.open_ms")


def filter_times(driver, url: str) -> dict[str, float]:
    driver.get("about:blank")
    driver.get(url + "/#episodes")
    wait_for(driver, "return document.body.dataset.episodesLoaded >= '1'")
    out = {}
    for name, script in FILTERS.items():
        loaded = driver.execute_script("return document.body.dataset.episodesLoaded")
        driver.execute_script(script)
        wait_for(driver, f"return document.body.dataset.episodesLoaded !== '{loaded}'")
        out[name] = driver.execute_script("return window.viewer.timing.filter_ms")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    groups, samples = max(1, args.episodes // args.steps // 5), 5
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        run = make_run(Path(tmp) / "run", steps=args.steps, groups=groups, samples=samples)
        size = (run / "rollouts.jsonl").stat().st_size / 2**20
        progress(f"{args.steps * groups * samples} episodes, {args.steps} steps written in "
                 f"{time.perf_counter() - t:.1f}s (rollouts.jsonl {size:.1f} MB)")
        t = time.perf_counter()
        served = Served(run)
        progress(f"viewer indexed the run in {time.perf_counter() - t:.2f}s")
        driver = chromium()
        try:
            open_once(driver, served.url)  # chromium's own first start is not the page's
            opens = [open_once(driver, served.url) for _ in range(args.repeat)]
            runs = [filter_times(driver, served.url) for _ in range(args.repeat)]
        finally:
            driver.quit()
            served.close()
    rows = [["open the page (overview drawn)", f"{median(opens):.0f}", f"{max(opens):.0f}", "< 2000"]]
    rows += [[f"filter: {name}", f"{median([r[name] for r in runs]):.0f}", f"{max(r[name] for r in runs):.0f}", "< 200"]
             for name in FILTERS]
    print(table(["in the browser", "median ms", "max ms", "goal ms"], rows,
                f"run viewer, {args.steps * groups * samples} episodes over {args.steps} steps, {args.repeat} repeats"))


if __name__ == "__main__":
    print_host()
    main()
