"""Secret config values (API keys, tokens): pydantic `SecretStr`s that are written out only as `**********`.

A secret field (`Secret` below; today `server.api_key`) takes one of
  - `env:NAME`  the value of the environment variable NAME (read once, when the config is loaded);
  - `file:PATH` the contents of the file PATH, without the trailing newline;
  - the value itself, in a YAML config file only.
A literal on the command line (a `dotted.key=value` override, `--api-key`) is refused: every user of the
machine reads a process's argv in `ps`. The loader warns when a YAML file holding a literal secret can be
read by other users (`agentrl.config.load`).

`model_dump()` (summary.json, the wandb run's config), `model_dump_json()`, `repr` and `str` of the config
show the mask, never the value; the value is read only with `.get_secret_value()` where it is used (the
OpenAI endpoint's bearer check). Every value resolved here is also remembered so that
`RedactSecrets` can mask it in log lines that quote it by accident (an exception echoing a header).
"""

from __future__ import annotations

import logging
import os
import typing
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, SecretStr

REDACTED = "**********"
ENV_PREFIX, FILE_PREFIX = "env:", "file:"
HOW_TO_GIVE = ("env:NAME (an environment variable holding it) or file:PATH (a file holding it, e.g. chmod 600)")

_KNOWN: set[str] = set()  # every secret value resolved in this process, for RedactSecrets
MIN_SEARCHED = 8  # shorter values (toy keys in tests) would mask ordinary words in log lines


def is_reference(value: Any) -> bool:
    """`env:NAME` or `file:PATH`: names where the secret is, without being it (safe in argv and files)."""
    return isinstance(value, str) and value.startswith((ENV_PREFIX, FILE_PREFIX))


def _from_env(name: str) -> str:
    if not name:
        raise ValueError("env: needs a variable name, e.g. env:AGENTRL_API_KEY")
    value = os.environ.get(name)
    if not value:
        raise ValueError(f"the environment variable {name} (named by env:{name}) is not set or empty")
    return value


def _from_file(where: str) -> str:
    if not where:
        raise ValueError("file: needs a path, e.g. file:~/.config/agentrl/api_key")
    path = Path(where).expanduser()
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the secret file {path} (named by file:{where}): "
                         f"{getattr(exc, 'strerror', None) or type(exc).__name__}") from None
    value = text.rstrip("\r\n")  # what `echo KEY > file` writes; inner whitespace is the user's
    if not value.strip():
        raise ValueError(f"the secret file {path} (named by file:{where}) is empty")
    return value


def resolve(value: Any) -> Any:
    """`env:NAME` / `file:PATH` -> the secret they name; a literal string as it is. ValueErrors name the
    variable or file, never the value."""
    if value is None or isinstance(value, SecretStr):
        return value
    if not isinstance(value, str):
        # YAML reads `api_key: 1234` as a number; the number's text would be a guess at the intended key.
        raise ValueError(f"must be a string ({HOW_TO_GIVE}, or the value itself in quotes), "
                         f"got {type(value).__name__}")
    if value.startswith(ENV_PREFIX):
        value = _from_env(value.removeprefix(ENV_PREFIX))
    elif value.startswith(FILE_PREFIX):
        value = _from_file(value.removeprefix(FILE_PREFIX))
    elif not value.strip():
        raise ValueError("is empty; leave it unset for no authentication")
    if len(value) >= MIN_SEARCHED:
        _KNOWN.add(value)
    return value


def _mask(value: SecretStr | None) -> str | None:
    return None if value is None else REDACTED


# `when_used="always"`: also the Python-mode model_dump() that run.py writes to summary.json and hands
# to wandb, where a plain SecretStr would stay a SecretStr object (and break json.dumps).
Secret = Annotated[SecretStr, BeforeValidator(resolve), PlainSerializer(_mask, return_type=str | None,
                                                                        when_used="always")]


def is_secret(annotation: Any) -> bool:
    """True for a field annotated `Secret` (also `Secret | None`)."""
    if annotation is SecretStr or (isinstance(annotation, type) and issubclass(annotation, SecretStr)):
        return True
    return any(is_secret(arg) for arg in typing.get_args(annotation))


def redact(text: str) -> str:
    """`text` with every secret value this process resolved replaced by the mask."""
    for value in _KNOWN:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def masked(value: Any) -> Any:
    """`value` (a config dump, a record) with every SecretStr and every known secret value masked."""
    if isinstance(value, SecretStr):
        return REDACTED
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked(v) for v in value]
    return value


class RedactSecrets(logging.Filter):
    """Masks the known secret values in a record's formatted message and traceback, whatever quoted them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _KNOWN:
            return True
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            if redact(text) != text:
                record.exc_text, record.exc_info = redact(text), None
        return True


def drawn_secret() -> SecretStr:
    """A bearer token drawn for this run alone (256 bits), masked like a configured one in log lines: what a
    server the run starts for its own clients requires when the user gave none."""
    import secrets

    value = secrets.token_urlsafe(32)
    _KNOWN.add(value)
    return SecretStr(value)
