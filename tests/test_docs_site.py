"""The docs site (mkdocs.yml, docs/) builds, strict, from the repository's sources alone, with the
configuration reference generated from the config schema; and strict mode does fail a build: a link to
a missing page, a link to a missing anchor and a page left out of the nav each stop it.

Each build runs `python -m mkdocs build --strict` on a copy of the sources a fresh clone has (mkdocs.yml,
docs/, the packages the reference is generated from; no caches, no built site), so nothing left in the
working tree can make it pass. The commands in the pages are run by tests/test_docs.py.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from agentrl.config.help import default_text
from agentrl.config.load import all_keys
from agentrl.config.schema import Config, ClusterConfig, TrainConfig
from agentrl.config.stages import StageConfig

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("mkdocs.yml", "docs", "agentrl", "envs", "rewards", "tests/check_layout.py")


def generator():
    """docs/gen_config_reference.py (a hook file, not a package module), loaded from its path."""
    spec = importlib.util.spec_from_file_location("gen_config_reference", ROOT / "docs" / "gen_config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def source_copy(tmp: Path) -> Path:
    """The files of a fresh clone the site is built from, without caches or a built site."""
    repo = tmp / "repo"
    repo.mkdir()
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / name)
    return repo


def build(repo: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about mkdocs 2, not ours
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=600)


def table_rows(page: str) -> dict[str, list[str]]:
    """The rows of a built page's tables, by the text of their first cell, as plain text cells."""
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", page, re.S):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        if cells:
            rows[cells[0]] = cells
    return rows


def test_the_site_builds_strict_with_the_generated_reference(tmp_path):
    proc = build(source_copy(tmp_path), tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Documentation built" in proc.stderr
    site = tmp_path / "site"
    for page in ("algorithms", "writing-an-env", "scale-out", "durability", "benchmarks", "layout", "rewards"):
        assert (site / page / "index.html").is_file(), page
    rows = table_rows((site / "configuration-reference" / "index.html").read_text())
    # key | type | default | bounds | description, the default as the schema has it
    bind = rows["cluster.bind_host"]
    assert bind[1:4] == ["str", "127.0.0.1", "length >= 1"], bind
    assert bind[2] == ClusterConfig.model_fields["bind_host"].default
    keep = rows["train.checkpoint_keep"]
    assert keep[1:4] == ["int", "2", ">= 0"], keep
    assert keep[4] == TrainConfig.model_fields["checkpoint_keep"].description
    assert rows["buffer.max_staleness"][2] == default_text(Config.model_fields["buffer"].annotation.model_fields["max_staleness"])
    assert rows["optim.zero_stage"][1] != ""  # the stages' tree is there too
    # the hand-written pages link to it and to each other: strict mode checked every one of those links
    assert 'href="../configuration/"' in (site / "configuration-reference" / "index.html").read_text()
    # the layout page's tree and tiers come from the package and the layout test's table, not from prose
    layout = html.unescape((site / "layout" / "index.html").read_text())
    assert "<!-- generated: layout -->" not in layout
    for name in sorted(p.name for p in (ROOT / "agentrl").iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        assert f"  {name}/" in layout, name
    for i, (heading, units) in enumerate(layout_tiers()):
        row = table_rows(layout)[str(i)]
        assert row[1] == heading and row[2].split(", ") == list(units), row


def layout_tiers():
    spec = importlib.util.spec_from_file_location("check_layout", ROOT / "tests" / "check_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TIERS


def test_a_broken_link_a_missing_anchor_or_a_page_out_of_the_nav_fails_the_build(tmp_path):
    repo = source_copy(tmp_path)
    page = repo / "docs" / "metrics.md"
    page.write_text(page.read_text() + "\nSee [the tuning page](tuning.md) and [KL](algorithms.md#no-such-section).\n")
    (repo / "docs" / "orphan.md").write_text("# A page no nav entry names\n")
    proc = build(repo, tmp_path / "site")
    assert proc.returncode != 0, proc.stderr[-4000:]
    out = proc.stdout + proc.stderr
    assert re.search(r"Aborted with 3 warnings in strict mode", out), out[-4000:]
    assert "Doc file 'metrics.md' contains a link 'tuning.md', but the target is not found" in out, out[-4000:]
    assert "'algorithms.md' does not contain an anchor '#no-such-section'" in out, out[-4000:]
    assert re.search(r"not included in the \"nav\" configuration:\s+- orphan\.md", out), out[-4000:]


def test_the_reference_lists_every_key_of_both_trees():
    text = generator().reference()
    missing = [k for model in (Config, StageConfig) for k in all_keys(model) if f"`{k}`" not in text]
    assert missing == []


def test_a_key_added_to_the_schema_appears_with_no_hand_edit():
    class Inner(BaseModel):
        """A section added later."""
        new_key: int = Field(7, ge=1, le=9, description="what the new key does")
        choice: str | None = Field(None, description="an optional one")

    class Tree(BaseModel):
        inner: Inner = Field(default_factory=Inner, description="the new section")

    text = "\n".join(generator().tree(Tree, "A tree", "intro"))
    assert "### `inner`" in text and "A section added later." in text
    assert "| `inner.new_key` | int | `7` | >= 1, <= 9 | what the new key does |" in text.replace("&gt;", ">").replace("&lt;", "<")
    assert "| `inner.choice` | str \\| None | `unset` |  | an optional one |" in text
