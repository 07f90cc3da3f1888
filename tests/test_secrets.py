"""Secret config values (`server.api_key`): read from an env var or a file, never from argv, and masked in
every file, tracker and log line a run writes (summary.json through the sink run.py uses, the wandb run's
config, log records formatting the config)."""

from __future__ import annotations

import json
import logging
import os

import pytest
from pydantic import SecretStr

from agentrl import serve
from agentrl.config import ConfigError, ServerConfig, load_config
from agentrl.config.secrets import REDACTED, RedactSecrets
from agentrl.telemetry.metrics import MetricsSink, setup_logging
from agentrl.telemetry.trackers import WandbTracker

KEY = "sk-live-7f3a9c1e5b2d4086"  # long enough for the log filter to search for it


def _yaml_with_key(tmp_path, mode: int = 0o600):
    path = tmp_path / "serve.yaml"
    path.write_text(f"server:\n  api_key: '{KEY}'\n")
    path.chmod(mode)
    return path


def test_the_key_comes_from_an_env_var_a_file_or_the_yaml_file(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_API_KEY", KEY)
    by_env = load_config(None, ["server.api_key=env:AGENTRL_TEST_API_KEY"])
    (tmp_path / "key").write_text(KEY + "\n")  # what `echo KEY > key` writes
    by_file = load_config(None, [f"server.api_key=file:{tmp_path / 'key'}"])
    by_yaml = load_config(_yaml_with_key(tmp_path))
    assert {c.server.api_key.get_secret_value() for c in (by_env, by_file, by_yaml)} == {KEY}
    assert load_config(None).server.api_key is None  # unset: no authentication


def test_a_reference_that_names_nothing_is_a_config_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTRL_NO_SUCH_VAR", raising=False)
    with pytest.raises(ConfigError, match=r"^invalid config: server.api_key: the environment variable "
                                          r"AGENTRL_NO_SUCH_VAR \(named by env:AGENTRL_NO_SUCH_VAR\) is not set"):
        load_config(None, ["server.api_key=env:AGENTRL_NO_SUCH_VAR"])
    with pytest.raises(ConfigError, match=r"server.api_key: cannot read the secret file .*/nope \(named by "
                                          r"file:.*/nope\): No such file or directory"):
        load_config(None, [f"server.api_key=file:{tmp_path / 'nope'}"])
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"server.api_key: the secret file .*/empty .* is empty"):
        load_config(None, [f"server.api_key=file:{tmp_path / 'empty'}"])
    (tmp_path / "num.yaml").write_text("server: {api_key: 1234}\n")
    with pytest.raises(ConfigError, match=r"server.api_key: must be a string .*got int"):
        load_config(tmp_path / "num.yaml")


@pytest.mark.parametrize("override", [f"server.api_key={KEY}", f"server={{api_key: {KEY}}}", "server.api_key=123"])
def test_a_literal_key_on_the_command_line_is_refused(override):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    msg = str(err.value)
    assert msg.startswith("server.api_key is given on the command line, where every user of this machine reads it "
                          "(ps); give server.api_key=env:NAME (an environment variable holding it) or "
                          "server.api_key=file:PATH"), msg
    assert KEY not in msg


def test_a_yaml_file_holding_a_key_warns_only_when_others_can_read_it(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="agentrl.config.load"):
        load_config(_yaml_with_key(tmp_path, 0o600))
        assert not caplog.records
        load_config(_yaml_with_key(tmp_path, 0o644))
    [record] = caplog.records
    assert "serve.yaml holds server.api_key itself and other users can read the file: chmod 600 it" in \
        record.getMessage() and KEY not in record.getMessage()


def test_summary_json_and_metrics_hold_no_key(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_API_KEY", KEY)
    cfg = load_config(None, ["server.api_key=env:AGENTRL_TEST_API_KEY", f"train.out_dir={tmp_path}"])
    sink = MetricsSink(tmp_path, 1, show=False, run_config=cfg.model_dump())
    sink.log({"step": 0, "reward_mean": 0.5, "note": f"Bearer {KEY}"})  # a record quoting it by accident
    # what run.py writes: the config's dump, plus a SecretStr handed in by other code
    path = sink.write_summary({"model": "m", "config": cfg.model_dump(), "extra": SecretStr(KEY)})
    text = "".join(f.read_text() for f in tmp_path.iterdir() if f.suffix in (".json", ".jsonl"))
    assert {f.name for f in tmp_path.iterdir() if f.suffix in (".json", ".jsonl")} == {
        "summary.json", "metrics.jsonl", "run_config.json"}
    summary = json.loads(path.read_text())
    assert json.loads((tmp_path / "run_config.json").read_text())["server"]["api_key"] == REDACTED
    assert KEY not in text
    assert summary["config"]["server"]["api_key"] == REDACTED and summary["extra"] == REDACTED
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["note"] == f"Bearer {REDACTED}"
    assert cfg.server.api_key.get_secret_value() == KEY  # the running process still has it


class _FakeWandb:
    def __init__(self):
        self.kwargs = None

    def init(self, **kwargs):
        self.kwargs = kwargs
        return self


def test_the_trackers_config_holds_no_key(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_API_KEY", KEY)
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = load_config(None, ["server.api_key=env:AGENTRL_TEST_API_KEY"])
    for run_config in (cfg.model_dump(), {"server": {"api_key": cfg.server.api_key}}, {"raw": [KEY]}):
        fake = _FakeWandb()
        WandbTracker(fake, tmp_path, 0, "p", run_config)
        sent = json.dumps(fake.kwargs["config"])
        assert KEY not in sent and REDACTED in sent, sent


@pytest.fixture
def cli_process():
    """What a CLI's set-up changes in this process (the root logger, os.environ), put back afterwards."""
    root = logging.getLogger()
    handlers, level, env = root.handlers[:], root.level, dict(os.environ)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    os.environ.clear()
    os.environ.update(env)


def test_log_records_formatting_the_config_hold_no_key(monkeypatch, capsys, cli_process):
    monkeypatch.setenv("AGENTRL_TEST_API_KEY", KEY)
    cfg = load_config(None, ["server.api_key=env:AGENTRL_TEST_API_KEY"])
    setup_logging()
    log = logging.getLogger("agentrl.test_secrets")
    log.info("config %s", cfg)
    log.info("server %r, dump %s, json %s", cfg.server, cfg.model_dump(), cfg.model_dump_json())
    log.warning("verifier said: 401 for Authorization: Bearer %s", cfg.server.api_key.get_secret_value())
    try:
        raise RuntimeError(f"header Bearer {KEY} refused")
    except RuntimeError:
        log.exception("request failed")
    err = capsys.readouterr().err
    assert KEY not in err
    assert err.count(REDACTED) >= 6 and "Bearer **********" in err and "RuntimeError: header Bearer" in err


def test_the_log_filter_leaves_short_values_and_other_text_alone():
    ServerConfig(api_key="k")  # toy keys in tests would mask ordinary letters
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "keep %s", ("kk",), None)
    assert RedactSecrets().filter(record) and record.getMessage() == "keep kk"


def test_serve_refuses_a_key_on_argv_and_says_what_to_use(capsys, monkeypatch, cli_process):
    assert serve.main(["--model", "default", "--api-key", KEY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: --api-key puts the key on the command line, where every user of this "
                          "machine reads it (ps); use --api-key-env NAME (an environment variable holding the key) "
                          "or --api-key-file PATH (a file holding it)")
    assert KEY not in err
    monkeypatch.delenv("AGENTRL_NO_SUCH_VAR", raising=False)
    # the variable is read with the config, before any engine starts
    assert serve.main(["--model", "default", "--api-key-env", "AGENTRL_NO_SUCH_VAR"]) == 2
    assert "config error: invalid config: server.api_key: the environment variable AGENTRL_NO_SUCH_VAR" in \
        capsys.readouterr().err
    assert "AGENTRL_NO_SUCH_VAR" not in os.environ
