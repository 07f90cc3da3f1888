"""The `agentrl` script (agentrl.cli, `[project.scripts]`): its dispatcher in-process, then the installed
console script in a fresh interpreter beside `python -m agentrl.<command>`, as a user runs both."""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agentrl import cli
from agentrl.utils import prog as prog_module
from agentrl.utils.prog import prog

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "agentrl"  # the console script `pip install -e .` writes beside python
HEAVY = ("torch", "vllm", "deepspeed", "ray", "transformers", "numpy", "pydantic", "yaml")


def runnable_modules() -> set[str]:
    """What `python -m agentrl.<name>` runs: agentrl/<name>.py with a `__main__` block, agentrl/<name>/__main__.py."""
    found = {p.parent.name for p in (ROOT / "agentrl").glob("*/__main__.py")}
    for path in (ROOT / "agentrl").glob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.If) and "__name__" in ast.unparse(n.test) for n in tree.body):
            found.add(path.stem)
    return found


def test_the_script_lists_every_command_python_m_runs():
    assert set(cli.COMMANDS) == runnable_modules()
    assert len(set(cli.COMMANDS)) == len(cli.COMMANDS)


def test_pyproject_installs_the_script():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"agentrl": "agentrl.cli:main"}


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_each_summary_is_the_docstrings_first_sentence_without_its_usage(command):
    text = cli.summary(command)
    assert text and text[0].isupper() and not text.startswith("`") and "python -m" not in text
    assert len(f"  {command:<12}  {text}") <= cli.WIDTH
    doc = " ".join(ast.get_docstring(ast.parse(cli.source(command).read_text())).split())
    words = [w for w in re.split(r"\W+", text.lower().removesuffix("...")) if w]
    assert all(w in doc.lower() for w in words), (text, doc[:200])


def test_hand_picked_summaries():
    assert cli.summary("check") == "A dry run of a config, in seconds, before training on it"
    assert cli.summary("dpo") == "Direct preference optimisation against the frozen starting model"  # (...) left out
    assert cli.summary("lora_merge") == "A LoRA adapter folder merged into its base model"  # up to its first comma
    assert cli.summary("models") == "Prepare a named pretrained model offline (agentrl.models.named)"
    assert cli.source("models") == ROOT / "agentrl" / "models" / "__main__.py"


def dispatch(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli.main(list(argv), out=out, err=err), out.getvalue(), err.getvalue()


def test_help_lists_the_commands_on_stdout():
    for argv in (["--help"], ["-h"], ["help"]):
        rc, out, err = dispatch(*argv)
        assert (rc, err) == (0, "")
        assert out == cli.usage()
        listed = re.findall(r"^  (\w+) {2,}\S", out, re.M)
        assert listed == list(cli.COMMANDS)


def test_no_command_prints_the_list_on_stderr_and_exits_2():
    assert dispatch() == (2, "", cli.usage())


@pytest.mark.parametrize("word, near", [("trian", "train"), ("evl", "eval"), ("lora-merge", "lora_merge"),
                                        ("--trian", "train"), ("xyzzy", None)])
def test_an_unknown_command_names_the_nearest_and_exits_2(word, near):
    rc, out, err = dispatch(word, "--config", "x.yaml")
    assert (rc, out) == (2, "")
    assert f"'{word}' is not an agentrl {'option' if word.startswith('-') else 'command'}" in err
    if near:
        assert f"The most similar command is: agentrl {near}\n" in err
    else:
        assert "most similar" not in err
    assert "agentrl --help" in err


def test_version():
    rc, out, _ = dispatch("--version")
    assert rc == 0 and re.fullmatch(r"agentrl \S+\n", out)


@pytest.fixture
def ran(monkeypatch):
    """cli.run without running: what it would hand runpy, with sys.argv, sys.path and prog restored after."""
    calls = []
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(prog_module, "SCRIPT", None)

    def run_module(name, run_name, alter_sys):
        calls.append((name, run_name, alter_sys, list(sys.argv), sys.path[0], prog("x")))

    monkeypatch.setattr(cli.runpy, "run_module", run_module)
    return calls


def test_a_command_runs_as_python_m_runs_it_with_its_arguments_untouched(ran, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--config", "x.yaml", "train.steps=3", "--help", "-h", "--version", "help"]
    assert dispatch("train", *args) == (0, "", "")
    [(name, run_name, alter_sys, argv, first, shown)] = ran
    assert (name, run_name, alter_sys) == ("agentrl.train", "__main__", True)
    assert argv == [str(ROOT / "agentrl" / "train.py"), *args]
    assert first == str(tmp_path) or sys.flags.safe_path  # -m puts the current folder first
    assert shown == "agentrl x"


def test_help_of_a_command_is_its_own_help(ran):
    dispatch("help", "models")
    assert [(c[0], c[3][1:]) for c in ran] == [("agentrl.models", ["--help"])]


def test_prog_reads_python_m_unless_the_script_runs_the_command(monkeypatch):
    assert prog("train") == "python -m agentrl.train"
    monkeypatch.setattr(prog_module, "SCRIPT", "agentrl")
    assert prog("train") == "agentrl train"


# The installed script, cold: a fresh interpreter per command, as a user's shell starts it.

def cold_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_LOGGING", "WARM_PYTHON"))}
    return {**env, "PYTHONPATH": str(ROOT), "CI": "true"}


def cold(*argv: str, cwd: Path = ROOT, timeout: int = 120) -> subprocess.CompletedProcess:
    assert SCRIPT.is_file(), f"{SCRIPT} is missing: install the package again (pip install -e .) to write it"
    return subprocess.run(argv, cwd=cwd, env=cold_env(), capture_output=True, text=True, timeout=timeout)


def test_cold_help_imports_no_command():
    proc = cold(str(SCRIPT), "--help")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == cli.usage()
    probe = cold(sys.executable, "-c", "import sys\nfrom agentrl.cli import main\nassert main(['--help']) == 0\n"
                 f"print(sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")
    assert probe.returncode == 0 and probe.stderr.strip() == "[]", probe.stderr[-3000:]


def test_cold_unknown_command_and_no_command_exit_2():
    proc = cold(str(SCRIPT), "trian", "--config", "x.yaml")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert "The most similar command is: agentrl train" in proc.stderr
    proc = cold(str(SCRIPT))
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", cli.usage())


@pytest.mark.parametrize("command", ["train", "check", "models"])
def test_cold_command_help_in_both_forms(command):
    script, module = cold(str(SCRIPT), command, "--help"), cold(sys.executable, "-m", f"agentrl.{command}", "--help")
    assert script.returncode == module.returncode == 0, script.stderr[-3000:] + module.stderr[-3000:]
    assert script.stdout.startswith(f"usage: agentrl {command} ")
    assert module.stdout.startswith(f"usage: python -m agentrl.{command} ")
    body = script.stdout.split("\n\n", 1)[1]  # after the usage (wrapped to its prog's width)
    assert body == module.stdout.split("\n\n", 1)[1]


def test_cold_stage_help_names_the_script():
    proc = cold(str(SCRIPT), "dpo", "--help")
    assert proc.returncode == 0 and "Keys of `agentrl dpo` and their defaults." in proc.stdout


TIMES = re.compile(r"\d+\.\d+ m?s *")  # timings, and the padding after them


def test_cold_check_runs_the_same_in_both_forms_with_an_env_beside_the_config(tmp_path, tiny_model):
    """A real command, no engine: `check --policy scripted` on an env module in the current folder, which
    `python -m` finds there (the folder is first on sys.path) and so must the script."""
    (tmp_path / "my_env.py").write_text("from envs.guess_number import GuessNumberEnv as MyEnv\n")
    config = (ROOT / "examples/agents/guess_number.yaml").read_text()
    (tmp_path / "cfg.yaml").write_text(config.replace("envs.guess_number:GuessNumberEnv", "my_env:MyEnv"))
    args = ["--config", "cfg.yaml", "--policy", "scripted", "--tasks", "2", f"model.path={tiny_model}",
            "data.train_tasks=16", "data.eval_tasks=4"]
    script = cold(str(SCRIPT), "check", *args, cwd=tmp_path, timeout=300)
    assert script.returncode == 0, script.stderr[-6000:]
    module = cold(sys.executable, "-m", "agentrl.check", *args, cwd=tmp_path, timeout=300)
    assert module.returncode == 0, module.stderr[-6000:]
    assert "  env    : my_env:MyEnv\n" in script.stdout and "check passed" in script.stdout
    assert TIMES.sub("T", script.stdout) == TIMES.sub("T", module.stdout)
