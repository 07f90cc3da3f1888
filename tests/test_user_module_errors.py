"""A user's module named in the config (an Env, a reward rule, a registry entry) that fails while it is
imported is a one-line config error naming its file and line and the key that named it, exit code 2, as
`python -m agentrl.check --config FILE` run in the user's folder prints it (agentrl.utils.registry's
`import_user_module`); a module that is not there keeps its own message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.utils.registry import import_user_module, lookup

REPO = Path(__file__).resolve().parents[1]

MODULES = {
    "__init__.py": "",
    "zero.py": "from agentrl.env import Env\n\nRATE = 1 / 0\n\n\nclass ZeroEnv(Env):\n    pass\n",
    "syntax.py": "def score(episode):\n    return (episode.reward\n",
    "helper.py": "def table():\n    return {}['rates']\n",
    "losses.py": "from my_pkg.helper import table\n\nTABLE = table()\n",
    "needs_dep.py": "import numpy_typo_not_installed\n",
}


def user_folder(tmp: Path) -> Path:
    (tmp / "my_pkg").mkdir()
    for name, text in MODULES.items():
        (tmp / "my_pkg" / name).write_text(text)
    return tmp


def syntax_error() -> SyntaxError:
    try:
        compile(MODULES["syntax.py"], "syntax.py", "exec")
    except SyntaxError as exc:
        return exc
    raise AssertionError("syntax.py compiles")


SYNTAX = syntax_error()  # the parser's own words and line, which differ between Python versions

# (config file, the one line on stderr)
CASES = {
    "env raising at import": (
        "env:\n  import_path: my_pkg.zero:ZeroEnv\n",
        "config error: env.import_path: my_pkg/zero.py:3 raised ZeroDivisionError at import: division by zero"),
    "reward rule with a syntax error": (
        "rewards:\n  sources:\n    - {name: mine, type: rule, rule: 'my_pkg.syntax:score'}\n",
        f"config error: rewards.sources.0.rule='my_pkg.syntax:score': my_pkg/syntax.py:{SYNTAX.lineno} raised "
        f"SyntaxError at import: {SYNTAX.msg}"),
    "policy loss whose module fails in a helper": (
        "algo:\n  policy_loss: my_pkg.losses:mine\n",
        "config error: invalid config: algo.policy_loss='my_pkg.losses:mine': my_pkg/helper.py:2 raised KeyError "
        "at import: 'rates'"),
    "env whose module imports what is not installed": (
        "env:\n  import_path: my_pkg.needs_dep:Env\n",
        "config error: env.import_path: my_pkg/needs_dep.py:1 raised ModuleNotFoundError at import: No module named "
        "'numpy_typo_not_installed'"),
    "env module that does not exist": (
        "env:\n  import_path: my_pkg.nope:Env\n",
        "config error: env.import_path: cannot import env module 'my_pkg.nope': No module named 'my_pkg.nope'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_check_command_prints_one_line_naming_file_line_and_key(tmp_path, case):
    text, expected = CASES[case]
    folder = user_folder(tmp_path)
    (folder / "agent.yaml").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO), "AGENTRL_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "agentrl.check", "--config", "agent.yaml"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [expected]


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    folder = user_folder(tmp_path)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(folder)
    for name in [m for m in sys.modules if m == "my_pkg" or m.startswith("my_pkg.")]:
        monkeypatch.delitem(sys.modules, name)
    return folder


def test_the_deepest_user_frame_is_named(on_path):
    with pytest.raises(ValueError) as err:
        import_user_module("my_pkg.losses")
    assert str(err.value) == "my_pkg/helper.py:2 raised KeyError at import: 'rates'"
    assert "my_pkg.losses" not in sys.modules  # a failed import leaves nothing half-made behind


def test_a_file_outside_the_working_directory_is_named_by_its_full_path(on_path, tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(ValueError) as err:
        import_user_module("my_pkg.zero")
    assert str(err.value) == f"{tmp_path / 'my_pkg' / 'zero.py'}:3 raised ZeroDivisionError at import: division by zero"


def test_a_module_that_exits_or_prints_a_long_message_stays_one_line(on_path):
    (on_path / "my_pkg" / "exits.py").write_text("import sys\n\nsys.exit('usage: exits.py\\n  --flag')\n")
    with pytest.raises(ValueError) as err:
        import_user_module("my_pkg.exits")
    assert str(err.value) == "my_pkg/exits.py:3 raised SystemExit at import: usage: exits.py --flag"


def test_missing_modules_and_bad_names_keep_importlib_s_errors(on_path):
    with pytest.raises(ModuleNotFoundError, match="No module named 'my_pkg.nope'"):
        import_user_module("my_pkg.nope")
    with pytest.raises(ModuleNotFoundError, match="No module named 'not_a_pkg'"):
        import_user_module("not_a_pkg.mod")
    with pytest.raises(TypeError):  # relative: importlib's own answer, worded by the caller
        import_user_module("..")
    with pytest.raises(ValueError, match=r"^algo.policy_loss='\.\.:x': cannot import '\.\.'"):
        lookup({}, "..:x", "algo.policy_loss")
    with pytest.raises(ValueError, match=r"^algo.policy_loss='my_pkg.nope:x': cannot import 'my_pkg.nope' \(No "
                                         r"module named 'my_pkg.nope'\)$"):
        lookup({}, "my_pkg.nope:x", "algo.policy_loss")
