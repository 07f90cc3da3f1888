"""The config loader under mutated configs (hypothesis): the shipped examples, the defaults and the whole
default tree of both config trees (RL and stage), with keys dropped, renamed with typos, values of
another type, numbers out of range, random unicode, nested junk, junk overrides and broken YAML text.

Every outcome is a validated config or a `ConfigError` whose message is one line naming a key of the
mutation (never a TypeError, KeyError, AttributeError, RecursionError or traceback). A bounded, seeded
run (`derandomize`): the same cases every time, a few seconds."""

from __future__ import annotations

import copy
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agentrl.config import Config, ConfigError, load_config
from agentrl.config.load import shown
from agentrl.config.stages import StageConfig

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").rglob("*.yaml"))
MAX_EXAMPLES = 300


def _bases() -> list[tuple[str, type[BaseModel], dict[str, Any]]]:
    """(name, schema, data): every shipped example, the empty config and the full default dump of each tree."""
    out = [(p.relative_to(REPO).as_posix(), Config, yaml.safe_load(p.read_text()) or {}) for p in EXAMPLES]
    out += [("defaults", Config, {}), ("full RL tree", Config, Config().model_dump(mode="json")),
            ("stage defaults", StageConfig, {}), ("full stage tree", StageConfig, StageConfig().model_dump(mode="json"))]
    return out


BASES = _bases()

Path_ = tuple[Any, ...]


def paths(node: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every key (dict) and index (list) path in `node`, parents before children."""
    out: list[Path_] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        out.append(prefix + (key,))
        out += paths(value, prefix + (key,))
    return out


def parent_of(data: Any, path: Path_) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data


def typo(key: str, rng: random.Random) -> str:
    """A key as fingers write it: two letters swapped, one dropped, one doubled, or a wrong case."""
    if len(key) < 2:
        return key + "x"
    i = rng.randrange(len(key) - 1)
    return rng.choice([key[:i] + key[i + 1] + key[i] + key[i + 2:], key[:i] + key[i + 1:],
                       key[:i] + key[i] + key[i:], key.upper(), key + "s"])


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(st.characters(exclude_categories=("Cs",)), max_size=12),
                    st.sampled_from(["", "0", "-1", "1e999", "null", "env:AGENTRL_FUZZ_UNSET", "file:/nonexistent",
                                     "http://", "a:b", "a.b:c", "..:x", ":", "ppo_clip", "gae", "loss", "~"]))
JUNK = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.one_of(st.text(max_size=6), st.integers()),
                                                                     inner, max_size=3)), max_leaves=8)


def out_of_range(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return rng.choice([-1, 0, 10**12, -10**12, 1e300, -1e-300, math.inf, math.nan])
    return rng.choice([-value - 1, value * 10**9, value + 10**15, -math.inf, math.nan, 0.5, -0.0])


@st.composite
def mutated(draw) -> tuple[str, type[BaseModel], dict[str, Any], list[str], list[Path_]]:
    """(base name, schema, mutated data, overrides, mutated paths)."""
    name, schema, base = draw(st.sampled_from(BASES))
    data = copy.deepcopy(base)
    rng = random.Random(draw(st.integers(0, 2**32)))
    overrides: list[str] = []
    touched: list[Path_] = []
    for _ in range(draw(st.integers(1, 3))):
        where = paths(data)
        op = draw(st.sampled_from(["drop", "rename", "retype", "range", "unicode", "junk", "add", "override"]))
        if not where or op == "add":
            at = rng.choice([()] + [p for p in where if isinstance(parent_of(data, p + ("",)), dict)])
            key = draw(st.one_of(st.text(max_size=10), st.integers(), st.sampled_from(["type", "default", "path"])))
            parent_of(data, at + ("",))[key] = draw(JUNK)
            touched.append(at + (key,))
            continue
        path = rng.choice(where)
        parent, last = parent_of(data, path), path[-1]
        touched.append(path)
        if op == "drop":
            del parent[last]
        elif op == "rename" and isinstance(parent, dict):
            new = typo(str(last), rng)
            parent[new] = parent.pop(last)
            touched[-1] = path[:-1] + (new,)
        elif op == "range":
            parent[last] = out_of_range(parent[last], rng)
        elif op == "unicode":
            parent[last] = draw(st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20))
        elif op == "override":
            value = draw(st.one_of(st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=15),
                                   JUNK.map(lambda v: yaml.safe_dump(v, default_flow_style=True, width=10**6)
                                            .removesuffix("\n...\n").strip())))
            overrides.append(".".join(map(str, path)) + "=" + value)
        else:  # retype, or a rename inside a list
            parent[last] = draw(JUNK)
    return name, schema, data, overrides, touched


def _names_a_key(msg: str, touched: list[Path_]) -> bool:
    words = {shown(part) for path in touched for part in path if len(shown(part)) > 1}
    words |= {".".join(map(shown, path)) for path in touched}
    return any(word in msg for word in words) or "config key" in msg or "config file" in msg


def check(case, tmp: Path) -> str:
    """'ok', or the ConfigError's message; anything else raised fails the caller."""
    name, schema, data, overrides, touched = case
    path = tmp / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    path.chmod(0o600)
    try:
        cfg = load_config(path, overrides, schema)
    except ConfigError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "Traceback" not in msg, (name, msg)
        assert _names_a_key(msg, touched), (name, touched, overrides, msg)
        return msg
    assert isinstance(cfg, schema)
    return "ok"


@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(case=mutated())
def test_mutated_configs_load_or_fail_with_a_config_error_naming_the_key(case, tmp_path_factory):
    check(case, tmp_path_factory.mktemp("fuzz", numbered=True))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(base=st.sampled_from(EXAMPLES), at=st.integers(0, 10**6),
       junk=st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8))
def test_broken_yaml_text_is_a_config_error(base, at, junk, tmp_path_factory):
    text = base.read_text()
    at %= len(text) + 1
    path = tmp_path_factory.mktemp("text", numbered=True) / "broken.yaml"
    path.write_text(text[:at] + junk + text[at:], encoding="utf-8")
    try:
        load_config(path)
    except ConfigError as exc:
        assert str(exc) and "\n" not in str(exc)


@pytest.mark.parametrize("name", [b[0] for b in BASES])
def test_every_base_loads_unmutated(name, tmp_path):
    assert check(next((n, s, d, [], []) for n, s, d in BASES if n == name), tmp_path) == "ok"


# What the fuzzing found, each once a raw exception or a message of several lines, now a config error.
FOUND = {
    "a reward source whose type is a list": (["rewards.sources=[{name: a, type: [1]}]"], None,
                                             r"^rewards.sources.0.type=\[1\] is not one of \['env', 'http'"),
    "env.kwargs.tool_server not a name": (["env.kwargs.tool_server=[1]"], None,
                                          r"^invalid config: env.kwargs.tool_server=\[1\] is not a server of tools"),
    "a NaN mixing weight": (["data.paths=[a.jsonl, b.jsonl]", "data.probs=[.nan, 1]"], StageConfig,
                            r"^invalid config: data.probs.0: Input should be a finite number$"),
    "an infinite deadline": (["rollout.episode_timeout_s=.inf"], None,
                             r"^invalid config: rollout.episode_timeout_s: Input should be a finite number$"),
    "a relative tool parser module": (["rollout.tool_format='..:x'"], None,
                                      r"^invalid config: rollout.tool_format='..:x': cannot import '..' "),
    "a key with a line break": (['data={"ev\\nal": 1}'], None, r"^unknown config key 'data.ev\\nal'; "),
    "an override nested too deeply": (["env.kwargs.a=" + "[" * 20000], None,
                                      r"^override 'env.kwargs.a': the value's collections are nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_what_the_fuzzing_found_is_a_one_line_config_error(case):
    overrides, schema, expected = FOUND[case]
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides, schema or Config)
    assert "\n" not in str(err.value)
    assert re.search(expected, str(err.value)), str(err.value)


def test_a_yaml_file_nested_too_deeply_or_not_text(tmp_path):
    (tmp_path / "deep.yaml").write_text("env:\n  kwargs:\n    a: " + "[" * 20000 + "]" * 20000 + "\n")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe rollout: 1")
    with pytest.raises(ConfigError, match=r"deep.yaml: collections nested too deeply to read$"):
        load_config(tmp_path / "deep.yaml")
    with pytest.raises(ConfigError, match=r"^cannot read config file .*binary.yaml: 'utf-8' codec can't decode"):
        load_config(tmp_path / "binary.yaml")
