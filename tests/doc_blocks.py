"""The commands the docs show, collected and adapted to a tiny run (used by tests/test_docs.py).

Collected: every command of a fenced ```bash block in README.md, the docs site's pages (docs/**/*.md)
and examples/**/README.md, in that order (backslash-continued lines joined, trailing `# comments`
dropped, `./scripts/install.sh &&` dropped: the suite runs after install) and every examples/agents/*.yaml
and examples/tutorials/*.yaml.

A tutorial page (docs/tutorials/*.md) is one block: its steps build on each other (the viewer step opens
the run the train step made), so its commands share one sandbox, in page order, and a failed step fails
the steps after it.

A command of the `agentrl` script, `agentrl CMD ARGS` (or `.venv/bin/agentrl CMD ARGS`), is read as the
`python -m agentrl.CMD ARGS` it runs (agentrl.cli; tests/test_cli.py runs both forms side by side).

A block or a command that cannot run here is marked in the markdown by an HTML comment on the lines
just above the fence (invisible in the rendered page):

    <!-- doc-test: not runnable here: REASON -->                 every command of the block
    <!-- doc-test: not runnable here (`PREFIX`): REASON -->      the block's commands starting with PREFIX

A block or a command another test already runs (at any size) points at that test instead; the doc test
then only checks, without running anything, that the test exists and its file names what the command
runs (`distinguishing`: the `--config` yaml of `agentrl.train`, the module of another `python -m`, the
script of `bash SCRIPT`):

    <!-- doc-test: run by tests/FILE.py::TEST -->                the block
    <!-- doc-test: run by tests/FILE.py::TEST (`PREFIX`) -->     the block's commands starting with PREFIX

An unmarked command no rule below adapts is a failure naming its file:line (`CannotAdapt`).
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.cli import COMMANDS as SCRIPT_COMMANDS

ROOT = Path(__file__).resolve().parents[1]

MARKER = re.compile(r"<!--\s*doc-test:(.*?)-->")
MARKER_BODY = re.compile(r"\s*not runnable here(?:\s*\(`(?P<prefix>[^`]+)`\))?:\s*(?P<reason>\S.*?)\s*$")
RUN_BY_BODY = re.compile(r"\s*run by (?P<test>tests/[\w/]+\.py::\w+)(?:\s*\(`(?P<prefix>[^`]+)`\))?\s*$")
FENCE_OPEN = re.compile(r"^(?P<indent>\s*)```bash\s*$")
FENCE_CLOSE = re.compile(r"^\s*```\s*$")
INSTALL = re.compile(r"^\./scripts/install\.sh\s*&&\s*")
PYTHON = re.compile(r"(?:(?<=^)|(?<=[\s($;&|]))(?:\.venv/bin/)?python3?(?=\s)")
SCRIPT_FORM = re.compile(r"(?:(?<=^)|(?<=[\s($;&|]))(?:\.venv/bin/)?agentrl\s+(%s)(?=[\s);&|`]|$)"
                         % "|".join(SCRIPT_COMMANDS))
ASSIGNMENTS = re.compile(r"^(?:[A-Za-z_]\w*=(?:\$\([^)]*\)|[^\s;$()]+)\s*(?:;\s*|$))+$")

# Tiny size. The embedded default model's warm start is cut to 2 steps (its full 300 take ~20 minutes on
# 2 busy cores); the cache entry is still built cold once by the first command that needs it.
TINY_DEFAULT = {"sft_steps": "2", "sft_batch_size": "8", "sft_demos": "32"}
TINY_TRAIN = ["train.steps=2", "data.eval_tasks=4", "rollout.n_samples=2", "buffer.batch_size=2",
              "train.eval_every=0", "train.checkpoint_every=0"]
TINY_STAGE = {"--max_steps": "2", "--batch_size": "4", "--micro_batch_size": "4", "--warmup_steps": "0",
              "--max_samples": "64", "--eval_every": "0"}
TINY_PIPELINE = {"RL_STEPS": "2", "SFT_STEPS": "2", "RM_STEPS": "2", "SAMPLES": "1", "EVAL_TASKS": "4"}
STEPS = 2
STAGES = ("agentrl.sft", "agentrl.rm", "agentrl.prm", "agentrl.dpo", "agentrl.kto")
# Modules that serve HTTP on `--port`, and the GET that answers once they are ready.
SERVERS = {"agentrl.serve": "/v1/models", "rewards.servers.tools": "/health", "rewards.servers.verifier": "/health",
           "rewards.servers.sandbox": "/health", "agentrl.view": "/api/run"}
TUTORIALS = "docs/tutorials/"


class CannotAdapt(Exception):
    """An unmarked documented command no rule runs at a tiny size."""


@dataclass
class Command:
    file: str                  # repo-relative path
    line: int                  # 1-based line of the command's first line
    text: str                  # as documented: continuation lines joined, comment and install prefix dropped
    block: str                 # file:line of the fence (yaml files: the file itself)
    skip: str | None = None    # the marker's reason
    run_by: str | None = None  # tests/FILE.py::TEST that runs it instead
    background: bool = False   # the line ends in `&`
    block_text: str = ""       # the whole block, for placeholders the block names

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Plan:
    """How to run one command here and what its success looks like."""
    kind: str                              # train | stage | merge | prepare | check | server | pipeline | assign
    script: str                            # bash, run in the block's sandbox
    env: dict[str, str] = field(default_factory=dict)
    out_dir: str | None = None             # train/stage/merge/pipeline: where the result must be
    port: int | None = None                # server: the port it listens on
    probe: str | None = None               # server: GET path that answers when it is ready


def strip_comment(line: str) -> str:
    """`line` without a trailing `# comment` (a `#` outside quotes, at the start or after a space)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md first (its first command builds the default model on the empty cache), then the docs
    site's pages, then the examples' READMEs."""
    examples = [p for p in sorted((root / "examples").glob("**/README.md")) if "node_modules" not in p.parts]
    return [root / "README.md", *sorted((root / "docs").glob("**/*.md")), *examples]  # not npm packages' pages


def parse_markers(lines: list[str], fence: int, where: str) -> tuple[tuple | None, list[tuple[str, tuple]]]:
    """The markers on the lines just above the fence at index `fence`: (block rule, [(prefix, rule)]),
    a rule being ("skip", reason) or ("run_by", "tests/FILE.py::TEST")."""
    block, prefixes = None, []
    i = fence - 1
    while i >= 0 and MARKER.search(lines[i]):
        for body in MARKER.findall(lines[i]):
            m = MARKER_BODY.fullmatch(body)
            r = RUN_BY_BODY.fullmatch(body)
            if not (m or r):
                raise CannotAdapt(f"{where}:{i + 1}: unreadable doc-test marker {body.strip()!r}; write "
                                  "`<!-- doc-test: not runnable here: REASON -->`, "
                                  "`<!-- doc-test: not runnable here (`PREFIX`): REASON -->`, "
                                  "`<!-- doc-test: run by tests/FILE.py::TEST -->` or "
                                  "`<!-- doc-test: run by tests/FILE.py::TEST (`PREFIX`) -->`")
            rule = ("skip", m["reason"]) if m else ("run_by", r["test"])
            prefix = (m or r)["prefix"]
            if prefix:
                prefixes.append((prefix, rule))
            else:
                block = rule
        i -= 1
    return block, prefixes


def collect_markdown(path: Path, root: Path = ROOT) -> list[Command]:
    rel = path.relative_to(root).as_posix()
    lines = path.read_text().splitlines()
    out: list[Command] = []
    i = 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if not m:
            if MARKER.search(lines[i]):
                j = i
                while j < len(lines) and MARKER.search(lines[j]):
                    j += 1
                if j == len(lines) or not FENCE_OPEN.match(lines[j]):
                    raise CannotAdapt(f"{rel}:{i + 1}: a doc-test marker must be just above a ```bash fence")
            i += 1
            continue
        fence = i
        block_rule, prefixes = parse_markers(lines, fence, rel)
        body_start = i + 1
        j = body_start
        while j < len(lines) and not FENCE_CLOSE.match(lines[j]):
            j += 1
        body = lines[body_start:j]
        block_id = rel if rel.startswith(TUTORIALS) else f"{rel}:{fence + 1}"
        cmds: list[Command] = []
        k = 0
        while k < len(body):
            start = k
            text = strip_comment(body[k].strip())
            while text.endswith("\\") and k + 1 < len(body):
                k += 1
                text = text[:-1].rstrip() + " " + strip_comment(body[k].strip())
            k += 1
            text = INSTALL.sub("", text).strip()
            if not text:
                continue
            cmd = Command(rel, body_start + start + 1, text, block_id, block_text="\n".join(body))
            cmd.background = text.endswith("&") and not text.endswith("&&")
            if cmd.background:
                cmd.text = text[:-1].rstrip()
            rule = block_rule
            for prefix, prefix_rule in prefixes:
                if cmd.text.startswith(prefix):
                    rule = prefix_rule
            if rule:
                setattr(cmd, rule[0], rule[1])
            cmds.append(cmd)
        for prefix, _ in prefixes:
            if not any(c.text.startswith(prefix) for c in cmds):
                raise CannotAdapt(f"{block_id}: the marker's prefix `{prefix}` starts none of the block's commands")
        out += cmds
        i = j + 1
    return out


def collect(root: Path = ROOT) -> list[Command]:
    """Every documented command, then every examples/agents/*.yaml and examples/tutorials/*.yaml no
    documented command trains."""
    cmds = [c for path in doc_files(root) for c in collect_markdown(path, root)]
    trained = set()
    for c in cmds:
        m = re.search(r"agentrl\.train\b.*?--config\s+(\S+)", as_module(c.text))
        if m:  # a marked one too: its marker says why the yaml is not run here
            trained.add(m[1])
    for yaml in [*sorted((root / "examples" / "agents").glob("*.yaml")),
                 *sorted((root / "examples" / "tutorials").glob("*.yaml"))]:
        rel = yaml.relative_to(root).as_posix()
        if rel not in trained:
            cmds.append(Command(rel, 1, f"python -m agentrl.train --config {rel}", rel))
    return cmds


def as_module(text: str) -> str:
    """`text` with each `agentrl CMD` of the script written as the `python -m agentrl.CMD` it runs."""
    return SCRIPT_FORM.sub(lambda m: f"python -m agentrl.{m[1]}", text)


def quote(tok: str) -> str:
    """Shell-quote a token but leave `$VAR` references in plain tokens to expand."""
    return tok if re.fullmatch(r"[\w@%+=:,./$-]+", tok) else shlex.quote(tok)


def tiny_prepare(text: str) -> str:
    """`agentrl.models prepare default` (without --sft-steps) gets the tiny warm-start settings."""
    def repl(m: re.Match) -> str:
        args = m[2] or ""
        if "--sft-steps" in args:
            return m[0]
        given = {a.split("=", 1)[0] for a in args.split() if "=" in a}
        extra = " ".join(f"{k}={v}" for k, v in TINY_DEFAULT.items() if k not in given)
        return f"{m[1]}{args} {extra}"
    return re.sub(r"(agentrl\.models\s+prepare\s+default)((?:\s+[^\s)`;&|]+)*)", repl, text)


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, tok in enumerate(argv[:-1]):
        if tok == flag:
            return argv[i + 1]
    for tok in argv:
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None


def _set_flags(argv: list[str], flags: dict[str, str]) -> list[str]:
    """argv with each of `flags` (`--name value`) replaced or appended."""
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok in flags:
            i += 2
            continue
        if tok.split("=", 1)[0] in flags and tok.startswith("--"):
            i += 1
            continue
        out.append(tok)
        i += 1
    for k, v in flags.items():
        out += [k, v]
    return out


def _train_config(argv: list[str]):
    """The config a `python -m agentrl.train` argv resolves to (files relative to the repo)."""
    from agentrl.config.load import load_config

    from agentrl.config import ConfigError

    config = _flag_value(argv, "--config")
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        return load_config(str(ROOT / config) if config else None, overrides)
    except ConfigError as exc:
        raise CannotAdapt(f"its config does not load: {exc}") from None


def adapt(cmd: Command, python: str) -> Plan:
    """How to run `cmd` at a tiny size in a sandbox (a folder that mirrors the repo's top level)."""
    text = PYTHON.sub(lambda _: shlex.quote(python), as_module(cmd.text))
    text = tiny_prepare(text)
    if ASSIGNMENTS.match(text):
        return Plan("assign", text)
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise CannotAdapt(f"{cmd.id}: cannot parse `{cmd.text}`: {exc}") from None
    env = {}
    while argv and re.fullmatch(r"[A-Za-z_]\w*=.*", argv[0]):
        k, v = argv.pop(0).split("=", 1)
        env[k] = v
    if argv[:1] == ["bash"] and argv[1:2] == ["examples/pipeline/run.sh"] and len(argv) == 2:
        env = {**env, **TINY_PIPELINE, "PYTHON": python}
        env.setdefault("OUT", "runs/pipeline")
        return Plan("pipeline", "bash examples/pipeline/run.sh", env=env, out_dir=env["OUT"])
    if env or argv[:2] != [python, "-m"] or len(argv) < 3:
        raise CannotAdapt(f"{cmd.id}: no rule runs `{cmd.text}` at a tiny size (mark it: see tests/doc_blocks.py)")
    module, args = argv[2], argv[3:]
    head = [python, "-m", module]
    if module == "agentrl.train":
        try:
            cfg = _train_config(args)
        except CannotAdapt as exc:
            raise CannotAdapt(f"{cmd.id}: `{cmd.text}`: {exc}") from None
        extra = list(TINY_TRAIN)
        if cfg.model.path is None and cfg.model.default.sft_steps > 0:
            # a 2-step warm start scores near 0 by design: the check that stops a too-weak one is off here
            extra += [f"model.default.{k}={v}" for k, v in TINY_DEFAULT.items()] + ["model.default.min_start_reward=null"]
        return Plan("train", " ".join(quote(t) for t in head + args + extra), out_dir=cfg.train.out_dir)
    if module == "agentrl.check":  # a dry run: the config's env on the tiny-warm-started default model
        try:
            cfg = _train_config(args)
        except CannotAdapt as exc:
            raise CannotAdapt(f"{cmd.id}: `{cmd.text}`: {exc}") from None
        extra = []
        if cfg.model.path is None and cfg.model.default.sft_steps > 0:
            extra = [f"model.default.{k}={v}" for k, v in TINY_DEFAULT.items()]
        return Plan("check", " ".join(quote(t) for t in head + args + extra))
    if module in STAGES:
        flags = dict(TINY_STAGE)
        out = _flag_value(args, "--out")
        if out and re.search(rf"agentrl\.lora_merge\b.*--lora\s+{re.escape(out)}(\s|$)", as_module(cmd.block_text)):
            flags["--lora_rank"] = "4"  # the block merges this run's adapter: it must be a LoRA run
        if out is None:
            raise CannotAdapt(f"{cmd.id}: a stage command without --out")
        return Plan("stage", " ".join(quote(t) for t in head + _set_flags(args, flags)), out_dir=out)
    if module == "agentrl.lora_merge":
        out = _flag_value(args, "--out")
        return Plan("merge", " ".join(quote(t) for t in head + args), out_dir=out)
    if module == "agentrl.models" and args[:1] == ["prepare"]:
        return Plan("prepare", " ".join(quote(t) for t in head + args))
    if module in SERVERS and _flag_value(args, "--port"):
        return Plan("server", " ".join(quote(t) for t in head + args), port=int(_flag_value(args, "--port")),
                    probe=SERVERS[module])
    raise CannotAdapt(f"{cmd.id}: no rule runs `{cmd.text}` at a tiny size (mark it: see tests/doc_blocks.py)")


def distinguishing(cmd: Command) -> str:
    """What a test that runs `cmd` must name: the `--config` yaml of `agentrl.train` (the module when it
    has none), the module of another `python -m`, the script of `bash SCRIPT`."""
    try:
        argv = shlex.split(as_module(cmd.text))
    except ValueError as exc:
        raise CannotAdapt(f"{cmd.id}: cannot parse `{cmd.text}`: {exc}") from None
    while argv and re.fullmatch(r"[A-Za-z_]\w*=.*", argv[0]):
        argv.pop(0)
    if argv[:1] == ["bash"] and len(argv) > 1:
        return Path(argv[1]).name
    if len(argv) > 2 and re.fullmatch(r"(?:\.venv/bin/)?python3?", argv[0]) and argv[1] == "-m":
        if argv[2] == "agentrl.train" and _flag_value(argv[3:], "--config"):
            return _flag_value(argv[3:], "--config")
        return argv[2]
    raise CannotAdapt(f"{cmd.id}: `{cmd.text}` is marked run by {cmd.run_by}, but it is neither "
                      "`python -m MODULE ...` nor `bash SCRIPT`: nothing to look for in that test")


def check_run_by(cmd: Command, root: Path = ROOT) -> str | None:
    """Why `cmd.run_by` does not point at a test that runs `cmd` (None when it does). Cheap: reads the
    test file, runs nothing."""
    file, _, name = cmd.run_by.partition("::")
    path = root / file
    if not path.is_file():
        return f"{cmd.id}: marked run by {cmd.run_by}, but there is no {file}"
    text = path.read_text()
    tests = {node.name for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if name not in tests:
        return f"{cmd.id}: marked run by {cmd.run_by}, but {file} has no function {name}"
    needle = distinguishing(cmd)
    if needle not in text:
        return f"{cmd.id}: marked run by {cmd.run_by}, but {file} never names {needle!r} (`{cmd.text}`)"
    return None
