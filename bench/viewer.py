"""The run viewer on a big run: 10,000 episodes over 200 steps (a synthetic run folder written by the
run's own writers, tests/viewer_run.py), measured in headless chromium with the page's own clock
(performance.now()): the time to open the page (navigation start to the overview drawn), the time a
filter takes (the request, the server's filtering of all 10,000 and the table drawn), a group opened
(request, its samples' ledgers drawn and laid out), a long episode (a group of two with --long-turns
turns appended to the run) coloured again by another quantity (the advantage, mu, the cause of each
token's training), and run against run: a second run of as many episodes, the page opened on both (the
overview overlaid), the Run vs run view (the config diff and the shared held-out tasks) and one task's
four answers. Goals: open < 2 s, the rest < 200 ms.

    python bench/viewer.py [--episodes 10000] [--steps 200] [--repeat 5] [--long-turns 1200]
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
from viewer_run import add_long_group, make_run  # noqa: E402

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


def counted(driver, url: str, flag: str, timing: str, script: str | None = None) -> float:
    """Opens `url` (or runs `script` on the page) and waits for the page to count `flag` once more; the
    page's own time for it (window.viewer.timing[timing])."""
    before = driver.execute_script(f"return document.body.dataset.{flag} || '0'")
    if script is None:
        driver.get("about:blank")
        driver.get(url)
        before = "0"
    else:
        driver.execute_script(script)
    wait_for(driver, f"return (document.body.dataset.{flag} || '0') !== '{before}'")
    return driver.execute_script(f"return window.viewer.timing.{timing}")


def single_run_views(driver, url: str, long_i: int) -> dict[str, float]:
    group = counted(driver, url + f"/#group/train/{long_i - 1}", "groupLoaded", "group_ms")  # a 5-sample group
    opened = counted(driver, url + f"/#episode/train/{long_i}", "episodeDrawn", "colour_ms")
    recolour = {}
    for q in ("advantage", "mu", "cause"):
        recolour[q] = counted(driver, url, "episodeDrawn", "colour_ms",
                              f"const s = document.getElementById('colour-by'); s.value = '{q}';"
                              "s.dispatchEvent(new Event('change'))")
    long_group = counted(driver, url + f"/#group/train/{long_i}", "groupLoaded", "group_ms")
    return {"group view: a group of 5": group, "group view: 2 long episodes": long_group,
            "a long episode drawn (conversation, ledger)": opened,
            **{f"colour a long episode: {q}": v for q, v in recolour.items()}}


def two_run_views(driver, url: str) -> dict[str, float]:
    opened = open_once(driver, url)
    runs = counted(driver, url + "/#runs", "runsLoaded", "runs_ms")
    task = counted(driver, url + "/#runs/task--3", "runsLoaded", "runs_ms")
    return {"two runs: open the page (overlaid)": opened, "two runs: run vs run view": runs,
            "two runs: a held-out task's 4 answers": task}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--long-turns", type=int, default=1200, help="turns of the long episodes (about 7 tokens each)")
    args = parser.parse_args()
    groups, samples = max(1, args.episodes // args.steps // 5), 5
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        run = make_run(Path(tmp) / "run", steps=args.steps, groups=groups, samples=samples,
                       config={"train": {"steps": args.steps}, "buffer": {"max_staleness": 2}})
        other = make_run(Path(tmp) / "other", steps=args.steps, groups=groups, samples=samples, seed=1,
                         config={"train": {"steps": args.steps}, "buffer": {"max_staleness": 4}})
        long_tokens = add_long_group(run, args.steps, args.long_turns)
        long_i = args.steps * groups * samples  # the long group's first episode
        size = (run / "rollouts.jsonl").stat().st_size / 2**20
        progress(f"2 runs of {args.steps * groups * samples} episodes, {args.steps} steps written in "
                 f"{time.perf_counter() - t:.1f}s (rollouts.jsonl {size:.1f} MB; long episodes {long_tokens} tokens)")
        t = time.perf_counter()
        served = Served(run)
        progress(f"viewer indexed the run in {time.perf_counter() - t:.2f}s")
        t = time.perf_counter()
        pair = Served(run, other)
        progress(f"viewer indexed both runs in {time.perf_counter() - t:.2f}s")
        driver = chromium()
        try:
            open_once(driver, served.url)  # chromium's own first start is not the page's
            opens = [open_once(driver, served.url) for _ in range(args.repeat)]
            runs = [filter_times(driver, served.url) for _ in range(args.repeat)]
            views = [single_run_views(driver, served.url, long_i) for _ in range(args.repeat)]
            views = [{**v, **two_run_views(driver, pair.url)} for v in views]
        finally:
            driver.quit()
            served.close()
            pair.close()
    rows = [["open the page (overview drawn)", f"{median(opens):.0f}", f"{max(opens):.0f}", "< 2000"]]
    rows += [[f"filter: {name}", f"{median([r[name] for r in runs]):.0f}", f"{max(r[name] for r in runs):.0f}", "< 200"]
             for name in FILTERS]
    rows += [[name, f"{median([v[name] for v in views]):.0f}", f"{max(v[name] for v in views):.0f}",
              "< 2000" if "open" in name else "< 200"] for name in views[0]]
    print(table(["in the browser", "median ms", "max ms", "goal ms"], rows,
                f"run viewer, {args.steps * groups * samples} episodes over {args.steps} steps (and a second run "
                f"of as many; long episodes of {long_tokens} tokens), {args.repeat} repeats"))


if __name__ == "__main__":
    print_host()
    main()
