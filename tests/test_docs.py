"""The docs are tested: every command of a ```bash block in README.md, docs/**/*.md and examples/**/README.md, and
every examples/agents/*.yaml that no documented command trains, runs here at a tiny size and must succeed.
Each command is its own test, named `file:line`; collection and adaptation are in tests/doc_blocks.py.

Cold cache. The whole module shares one fresh, empty AGENTRL_CACHE: the first command that needs the
embedded default model builds it (the cold-cache path: its stdout must stay clean), later ones reuse it.
The warm start is cut to 2 steps (doc_blocks.TINY_DEFAULT); `agentrl.models prepare default` gets the
same settings, so it prints the folder the train runs use.

The suite runs after `./scripts/install.sh` (that is how `.ci/run` / `scripts/test.sh` call it), so a
leading `./scripts/install.sh &&` is dropped; `python` and `.venv/bin/python` are this interpreter.

Sandbox. Each block runs in its own folder that mirrors the repo's top level (a symlink per entry, none
for runs/), so `--config examples/...` resolves as from the repo root, while everything a command writes
(runs/..., `--out rm`) lands in the test's tmp folder, never in the repo. Commands of one block share the
folder and the shell variables an assignment line (`D=...; W=$(...)`) sets. Placeholders the docs use
are stood in by files the test has, linked into the sandbox of a block that names them:
`MODEL` and `M` (the default model), `demos.jsonl`, `pairs.jsonl`, `kto.jsonl`, `steps.jsonl`
(examples/pipeline/make_data.py's demos, pairs, kto and prm files) and `runs/pipeline/data` (its folder).

Tiny size (doc_blocks.TINY_*): `agentrl.train` gets `train.steps=2 data.eval_tasks=4 rollout.n_samples=2
buffer.batch_size=2`: one group of two a step (and the 2-step warm start when it builds the default model); the stage CLIs
`--max_steps 2 --batch_size 4 --micro_batch_size 4 --max_samples 64` (and `--lora_rank 4` when the block
merges their adapter with `agentrl.lora_merge --lora <their --out>`); `examples/pipeline/run.sh` runs with
RL_STEPS=2 SFT_STEPS=2 RM_STEPS=2 SAMPLES=1 EVAL_TASKS=4. A command that is the same as an earlier one once shrunk
in the same block (`RL_STEPS=120 bash examples/pipeline/run.sh`) is skipped, naming the one that ran.

`python -m agentrl.check` (a dry run) gets the 2-step warm start when its config builds the default model.

Servers. A command of a module that serves HTTP (doc_blocks.SERVERS: agentrl.serve, rewards.servers.tools,
rewards.servers.verifier, rewards.servers.sandbox, agentrl.view) with a `--port` flag is a server:
- ending in `&`, it is started in the background, waited on until its port accepts connections, and
  stopped when the last command of its block has run;
- otherwise (it would run until stopped) it is started, waited on until GET <probe> on its port answers
  200 (`/v1/models` for agentrl.serve, `/health` for the tool and verifier servers, `/api/run` for the
  viewer), then stopped.

Success: exit 0; a train run's `summary.json` and a `metrics.jsonl` of 2 lines; a stage run's
`summary.json` with 2 steps; `agentrl.models prepare` prints one line, an existing folder, and nothing
else on stdout; `agentrl.check`'s last line is its "check passed" verdict; the pipeline's PPO stage trained
2 steps on the reward sources its REWARD names and it printed its summary, and a run.sh after another in the
same block (`REWARD=rm bash ...`) reused the data, SFT and RM stages and left the first run's PPO in place.

Started as: train and stage commands fork from tests/warm_python.py's warm interpreter, as the
end-to-end tests' do (FORKED_KINDS: the argv bash would run), and so do run.sh's own stages (its
`$PYTHON`); the rest run under bash, cold.

Not runnable here: a marker in the markdown just above the fence (see tests/doc_blocks.py) skips the
block, or the block's commands starting with a prefix, with its reason (listed by `pytest -ra`). An
unmarked command no rule adapts fails, naming its file:line.

Run by another test: the doc test runs only what no other test runs. A command another test already
runs (the same CLI on the same config, at any size) is marked `<!-- doc-test: run by
tests/FILE.py::TEST -->` (or with a `(`PREFIX`)`), and an examples/agents/*.yaml no documented command trains
is pointed at its test by YAML_RUN_BY here. Such a command is not run: it is skipped with "run by
TEST" (`pytest -ra` lists it) once a cheap check passes: TEST is a function of tests/FILE.py and that
file names the command's `--config` yaml (`agentrl.train`), its module (another `python -m`) or its
script (`bash SCRIPT`). A wrong pointer fails. Kept running: the first command, on the empty cache
(the only CLI run that builds the default model cold), examples/pipeline/run.sh, and whatever no other
test runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import warm_python
from tests import doc_blocks
from tests.doc_blocks import ROOT, STEPS, CannotAdapt, Command, adapt

pytestmark = pytest.mark.e2e

# examples/agents/*.yaml no documented command trains, that another test trains (at any size): checked, not run.
YAML_RUN_BY = {
    "examples/agents/arithmetic.yaml": "tests/test_e2e.py::test_on_policy_training_with_staleness_0",
    "examples/agents/custom_env.yaml": "tests/test_e2e.py::test_custom_env_example_runs",
}
COMMANDS = doc_blocks.collect()
for _cmd in COMMANDS:
    if _cmd.file in YAML_RUN_BY:
        _cmd.run_by = YAML_RUN_BY[_cmd.file]
TIMEOUT_S = 900
# Train and stage commands (`python -m agentrl.train | sft | rm ...`) are started as the end-to-end tests
# start theirs: forked from tests/warm_python.py's interpreter, which has imported torch, DeepSpeed and
# vLLM (with the argv bash would run, the block's environment, folder and streams). Nothing checks their
# stdout. So do run.sh's stages (its $PYTHON: warm_python.script_python). The commands whose stdout is
# the test (`agentrl.models prepare`, `W=$(...)`, run.sh's `BASE=$(...)`) and servers keep a fresh
# interpreter each, under bash: a library that prints on import shows there.
FORKED_KINDS = ("train", "stage")
COLD_MODULES = ("agentrl.models",)


@dataclass
class Block:
    dir: Path
    vars: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)
    failed: str | None = None


@dataclass
class DocRun:
    tmp: Path
    env: dict[str, str]
    blocks: dict[str, Block] = field(default_factory=dict)
    seen: dict[tuple, str] = field(default_factory=dict)
    _data: Path | None = None
    _model: Path | None = None

    def data(self) -> Path:
        """examples/pipeline/make_data.py's files (for demos.jsonl, pairs.jsonl, ...)."""
        if self._data is None:
            out = self.tmp / "data"
            subprocess.run([sys.executable, "examples/pipeline/make_data.py", "--out", str(out)], cwd=ROOT,
                           env=self.env, check=True, capture_output=True, timeout=300)
            self._data = out
        return self._data

    def model(self) -> Path:
        """The embedded default model at the tiny warm start (built by the first command that needed it)."""
        if self._model is None:
            settings = [f"{k}={v}" for k, v in doc_blocks.TINY_DEFAULT.items()]
            proc = subprocess.run([sys.executable, "-m", "agentrl.models", "prepare", "default", *settings],
                                  cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=TIMEOUT_S)
            assert proc.returncode == 0, proc.stderr[-4000:]
            self._model = Path(proc.stdout.strip())
        return self._model

    def placeholders(self) -> dict[str, callable]:
        return {"MODEL": self.model, "M": self.model,
                "demos.jsonl": lambda: self.data() / "demos.jsonl",
                "pairs.jsonl": lambda: self.data() / "pairs.jsonl",
                "kto.jsonl": lambda: self.data() / "kto.jsonl",
                "steps.jsonl": lambda: self.data() / "prm.jsonl",
                "runs/pipeline/data": self.data}

    def block(self, cmd: Command) -> Block:
        if cmd.block not in self.blocks:
            folder = self.tmp / re.sub(r"[^\w.-]+", "_", cmd.block)
            folder.mkdir()
            for entry in ROOT.iterdir():
                if entry.name not in {".git", "runs"}:
                    (folder / entry.name).symlink_to(entry)
            for name, target in self.placeholders().items():
                if re.search(rf"(?<![\w./$-]){re.escape(name)}(?![\w/-]|\.\w)", cmd.block_text):
                    link = folder / name
                    link.parent.mkdir(parents=True, exist_ok=True)
                    link.symlink_to(target())
            self.blocks[cmd.block] = Block(folder)
        return self.blocks[cmd.block]

    def stop(self, block: Block) -> None:
        for proc in block.procs:
            stop(proc)
        block.procs.clear()


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


@pytest.fixture(scope="module")
def docrun(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docs")
    cache = tmp / "cache"
    cache.mkdir()  # empty: the default model is built cold by the first command that needs it
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true", "AGENTRL_CACHE": str(cache)}
    run = DocRun(tmp, env)
    yield run
    for block in run.blocks.values():
        run.stop(block)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_ok(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def start_server(cmd: Command, plan, block: Block, env: dict) -> subprocess.Popen:
    assert not port_open(plan.port), f"{cmd.id}: port {plan.port} is already in use here"
    with open(block.dir / f"server-{cmd.line}.log", "w") as log:  # the server writes to its own copy
        proc = subprocess.Popen(["bash", "-c", "exec " + plan.script], cwd=block.dir, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    ready = (lambda: port_open(plan.port)) if cmd.background else (lambda: http_ok(plan.port, plan.probe))
    deadline = time.monotonic() + 600
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            text = (block.dir / f"server-{cmd.line}.log").read_text()[-6000:]
            pytest.fail(f"{cmd.id}: `{cmd.text}` never answered on port {plan.port} "
                        f"(exit {proc.returncode}):\n{text}")
        time.sleep(1)
    return proc


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.id for c in COMMANDS])
def test_documented_command(cmd: Command, docrun: DocRun):
    if cmd.run_by:
        try:
            wrong = doc_blocks.check_run_by(cmd)
        except CannotAdapt as exc:
            wrong = str(exc)
        if wrong:
            pytest.fail(wrong)
        pytest.skip(f"{cmd.id}: run by {cmd.run_by}")
    if cmd.skip:
        pytest.skip(f"{cmd.id}: not runnable here: {cmd.skip}")
    try:
        plan = adapt(cmd, sys.executable)
    except CannotAdapt as exc:
        pytest.fail(str(exc))
    key = (cmd.block, plan.script, tuple(sorted(plan.env.items())))
    if key in docrun.seen and plan.kind != "server":
        pytest.skip(f"{cmd.id}: same as {docrun.seen[key]} at a tiny size")
    docrun.seen[key] = cmd.id
    block = docrun.block(cmd)
    if block.failed:
        pytest.fail(f"{cmd.id}: not run: {block.failed} of the same block failed")
    block.failed = cmd.id  # until it passes
    env = {**docrun.env, **block.vars, **plan.env}
    try:
        run_plan(cmd, plan, block, env)
        block.failed = None
    finally:
        last = [c for c in COMMANDS if c.block == cmd.block][-1]
        if cmd is last:
            docrun.stop(block)


def run_plan(cmd: Command, plan, block: Block, env: dict) -> None:
    if plan.kind == "server":
        proc = start_server(cmd, plan, block, env)
        if cmd.background:
            block.procs.append(proc)
        else:
            stop(proc)
        return
    script = plan.script
    names = []
    if plan.kind == "assign":
        names = re.findall(r"(?:^|;)\s*([A-Za-z_]\w*)=", plan.script)
        script += "\n" + "".join(f'printf "%s\\0" "${name}"\n' for name in names)
    if plan.kind in FORKED_KINDS:
        # The block's shell variables are bash's, not exported: the command's environment has none of them.
        exported = {k: v for k, v in env.items() if k not in block.vars}
        proc = warm_python.run(bash_argv(script, block.dir, env), cwd=block.dir, env=exported,
                               capture_output=True, text=True, timeout=TIMEOUT_S)
    elif plan.kind == "pipeline":  # run.sh's own `"$PYTHON" -m agentrl.<stage>` fork; its prepare stays cold
        # A run.sh before it in the block, to the end, left its stages' stamps: this one must reuse them.
        reuses = (block.dir / plan.out_dir / ".stages" / "rm").is_file()
        with warm_python.script_python(env, script_variables=tuple(plan.env), cold=COLD_MODULES) as python:
            proc = subprocess.run(["bash", "-c", script], cwd=block.dir, env={**env, **python}, capture_output=True,
                                  text=True, timeout=TIMEOUT_S)
    else:
        proc = subprocess.run(["bash", "-c", script], cwd=block.dir, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    where = f"{cmd.id}: `{plan.script}`"
    assert proc.returncode == 0, f"{where} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-8000:]}"
    out = block.dir / plan.out_dir if plan.out_dir else None
    if plan.kind == "assign":
        values = proc.stdout.split("\0")[:-1]
        assert len(values) == len(names), f"{where}: printed more than its variables: {proc.stdout!r}"
        block.vars.update(zip(names, values))
        for name, value in zip(names, values):
            if re.search(rf"{name}=\$\([^)]*agentrl\.models prepare", plan.script):
                assert "\n" not in value and Path(value).is_dir(), f"{where}: ${name} is not one folder: {value!r}"
    elif plan.kind == "prepare":
        printed = proc.stdout.splitlines()
        assert len(printed) == 1 and Path(printed[0]).is_dir(), \
            f"{where}: stdout must be just the folder, got {proc.stdout[-2000:]!r}"
    elif plan.kind == "train":
        assert (out / "summary.json").is_file(), f"{where}: no {out}/summary.json"
        assert len(lines(out / "metrics.jsonl")) == STEPS, f"{where}: metrics.jsonl has not {STEPS} lines"
        json.loads((out / "summary.json").read_text())
    elif plan.kind == "stage":
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps"] == STEPS, f"{where}: {summary['steps']} steps"
    elif plan.kind == "check":
        assert proc.stdout.rstrip().splitlines()[-1].startswith("check passed"), f"{where}: {proc.stdout[-3000:]}"
    elif plan.kind == "merge":
        assert (out / "config.json").is_file(), f"{where}: no merged model in {out}"
    elif plan.kind == "pipeline":
        reward = plan.env.get("REWARD", "env+rm")
        ppo = {"env+rm": "ppo", "rm": "ppo_rm"}[reward]
        assert len(lines(out / ppo / "metrics.jsonl")) == STEPS
        sources = json.loads((out / ppo / "summary.json").read_text())["config"]["rewards"]["sources"]
        assert [s["name"] for s in sources] == reward.split("+"), f"{where}: trained on {sources}"
        assert json.loads((out / "sft" / "summary.json").read_text())["steps"] == STEPS
        assert "=== pipeline summary" in proc.stdout, proc.stdout[-3000:]
        if reuses:  # the stages before PPO ran once, and the first run's PPO is still there
            for stage in ("data", "sft", "eval_sft", "rm"):
                assert f"=== {stage}: reused" in proc.stderr, f"{where}: {stage} ran again\n{proc.stderr[-3000:]}"
            assert f"=== {ppo}: reused" not in proc.stderr
            assert (out / "ppo" / "summary.json").is_file(), f"{where}: the first run's PPO is gone"
    else:
        raise AssertionError(plan.kind)


def bash_argv(script: str, cwd: Path, env: dict) -> list[str]:
    """The argv bash runs for `script`, a simple command (a train or stage plan): its words expanded by
    bash itself ($W, $D/pairs.jsonl from the block's assignments), printed instead of executed."""
    words = subprocess.run(["bash", "-c", f"printf '%s\\0' {script}"], cwd=cwd, env=env, capture_output=True,
                           text=True, check=True).stdout
    return words.split("\0")[:-1]


def test_every_yaml_pointer_is_an_example_no_readme_trains():
    collected = {c.file for c in COMMANDS if c.file.endswith(".yaml")}
    assert set(YAML_RUN_BY) <= collected, set(YAML_RUN_BY) - collected


def test_bash_argv_is_the_argv_bash_expands(tmp_path):
    script = "/py -m agentrl.dpo --model $W --dataset $D/pairs.jsonl --out 'a b' --x=\"$W\"/c"
    assert bash_argv(script, tmp_path, {"W": "/m", "D": "runs/d", "PATH": os.environ["PATH"]}) == \
        ["/py", "-m", "agentrl.dpo", "--model", "/m", "--dataset", "runs/d/pairs.jsonl", "--out", "a b", "--x=/m/c"]


def test_a_run_by_pointer_is_checked(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        'CFG = "examples/agents/a.yaml"\ndef test_a():\n    run("agentrl.serve", CFG)\n')
    def cmd(text, test):
        return Command("R", 1, text, "R", run_by=test)
    check = lambda c: doc_blocks.check_run_by(c, tmp_path)
    assert check(cmd("python -m agentrl.train --config examples/agents/a.yaml x=1", "tests/test_x.py::test_a")) is None
    assert check(cmd("python -m agentrl.serve --port 1", "tests/test_x.py::test_a")) is None
    assert "never names 'examples/agents/b.yaml'" in check(
        cmd("python -m agentrl.train --config examples/agents/b.yaml", "tests/test_x.py::test_a"))
    assert "never names 'run.sh'" in check(cmd("REWARD=rm bash examples/pipeline/run.sh", "tests/test_x.py::test_a"))
    assert "has no function test_b" in check(cmd("python -m agentrl.serve", "tests/test_x.py::test_b"))
    assert "there is no tests/test_y.py" in check(cmd("python -m agentrl.serve", "tests/test_y.py::test_a"))


def test_the_agentrl_script_is_read_as_the_python_m_it_runs(tmp_path):
    """`agentrl CMD ARGS` in a block is collected as written and adapted, pointed at and counted as
    trained exactly as `python -m agentrl.CMD ARGS` (tests/test_cli.py: the two forms run the same)."""
    assert doc_blocks.as_module("agentrl train --config a.yaml x=1; .venv/bin/agentrl sft --out o &") == \
        "python -m agentrl.train --config a.yaml x=1; python -m agentrl.sft --out o &"
    assert doc_blocks.as_module("W=$(agentrl models prepare default)") == "W=$(python -m agentrl.models prepare default)"
    for same in ("agentrl --help", "agentrl trian", "runs/agentrl train", "pip install agentrl", "agentrl.train"):
        assert doc_blocks.as_module(same) == same
    (tmp_path / "examples" / "agents").mkdir(parents=True)
    (tmp_path / "examples" / "agents" / "a.yaml").write_text("train: {steps: 1}\n")
    (tmp_path / "README.md").write_text(
        "```bash\nagentrl train --config examples/agents/a.yaml\nagentrl sft --model m --out o\n"
        "agentrl lora_merge --base m --lora o --out merged\n```\n")
    cmds = doc_blocks.collect(tmp_path)  # a.yaml is trained by the page: not listed again
    assert [c.text for c in cmds] == ["agentrl train --config examples/agents/a.yaml", "agentrl sft --model m --out o",
                                      "agentrl lora_merge --base m --lora o --out merged"]
    plan = adapt(cmds[1], "/py")
    assert plan.kind == "stage" and plan.script.startswith("/py -m agentrl.sft --model m --out o ")
    assert "--lora_rank 4" in plan.script  # the block merges its adapter, named in the script form too
    assert adapt(cmds[2], "/py").script == "/py -m agentrl.lora_merge --base m --lora o --out merged"
    assert doc_blocks.distinguishing(cmds[0]) == "examples/agents/a.yaml"
    assert doc_blocks.distinguishing(cmds[1]) == "agentrl.sft"


def test_the_collector_reads_every_doc(tmp_path):
    """Cheap checks of the collector itself: continuation lines, comments, markers, and the yaml files."""
    (tmp_path / "examples" / "x").mkdir(parents=True)
    (tmp_path / "examples" / "agents").mkdir()
    (tmp_path / "examples" / "agents" / "a.yaml").write_text("train: {steps: 1}\n")
    (tmp_path / "examples" / "agents" / "b.yaml").write_text("train: {steps: 1}\n")
    (tmp_path / "examples" / "agents" / "c.yaml").write_text("train: {steps: 1}\n")
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    (tmp_path / "docs" / "guide" / "page.md").write_text(  # a docs page trains c.yaml: it is not listed again
        "# A page\n\n```bash\npython -m agentrl.train --config examples/agents/c.yaml\n```\n")
    (tmp_path / "README.md").write_text(
        "text\n```bash\npython -m agentrl.train --config examples/agents/a.yaml \\\n    a.b=1   # comment\n"
        "python -m rewards.servers.tools --port 8765 &   # bg\n```\n"
        "<!-- doc-test: not runnable here: needs a GPU -->\n```bash\n./scripts/install.sh && python -m x '#no'\n```\n")
    (tmp_path / "examples" / "x" / "README.md").write_text(
        "<!-- doc-test: not runnable here (`ray start`): a second machine -->\n"
        "<!-- doc-test: run by tests/test_s.py::test_sft (`python -m agentrl.sft --model x`) -->\n"
        "```bash\nray start --head\npython -m agentrl.sft --model m --out o\n"
        "python -m agentrl.sft --model x --out o\n```\n"
        "<!-- doc-test: run by tests/test_r.py::test_r -->\n```bash\npython -m agentrl.rm --out r\n```\n")
    cmds = doc_blocks.collect(tmp_path)
    got = [(c.id, c.text, c.background, c.skip, c.run_by) for c in cmds]
    assert got == [
        ("README.md:3", "python -m agentrl.train --config examples/agents/a.yaml a.b=1", False, None, None),
        ("README.md:5", "python -m rewards.servers.tools --port 8765", True, None, None),
        ("README.md:9", "python -m x '#no'", False, "needs a GPU", None),
        ("docs/guide/page.md:4", "python -m agentrl.train --config examples/agents/c.yaml", False, None, None),
        ("examples/x/README.md:4", "ray start --head", False, "a second machine", None),
        ("examples/x/README.md:5", "python -m agentrl.sft --model m --out o", False, None, None),
        ("examples/x/README.md:6", "python -m agentrl.sft --model x --out o", False, None, "tests/test_s.py::test_sft"),
        ("examples/x/README.md:10", "python -m agentrl.rm --out r", False, None, "tests/test_r.py::test_r"),
        ("examples/agents/b.yaml:1", "python -m agentrl.train --config examples/agents/b.yaml", False, None, None),
    ]
    plan = adapt(next(c for c in cmds if c.id == "examples/x/README.md:5"), "/py")
    assert plan.kind == "stage" and plan.out_dir == "o" and "--max_steps 2" in plan.script
    with pytest.raises(CannotAdapt, match="README.md:9"):
        adapt(Command("README.md", 9, "make all", "README.md:8"), "/py")
    assert doc_blocks.tiny_prepare("W=$(python -m agentrl.models prepare default)") == \
        "W=$(python -m agentrl.models prepare default sft_steps=2 sft_batch_size=8 sft_demos=32)"
    assert shlex.split(adapt(Command("R", 1, "X=1; Y=$(python -m agentrl.models prepare default)", "R"), "/py").script)
