"""Loading the config tree: YAML, `dotted.key=value` overrides, and errors a user can act on.

Unknown keys are rejected before pydantic sees them, naming the key and the nearest valid one
(`rollout.n_sampels` -> did you mean `rollout.n_samples`?), also inside reward sources, whose valid
keys depend on their `type`, and inside typed sub-configs (`algo.advantage`, `algo.kl`, ...), where a
key of another type is named with the type it belongs to. A key of an old layout is answered with its
new place (`agentrl.config.algo.MOVED_KEYS`). Every failure is a `ConfigError` whose message is one line.
"""

from __future__ import annotations

import difflib
import logging
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from agentrl.config.algo import MOVED_KEYS, moved_error
from agentrl.config.variants import member_for, misplaced, type_names, variants, variant_tags
from agentrl.config.schema import Config
from agentrl.config.secrets import HOW_TO_GIVE, is_reference, is_secret
from agentrl.config.sources import SOURCE_TYPES, RewardsConfig

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config that cannot be used; the one-line message says which file, line or key and why."""


def shown(key: Any) -> str:
    """A key as a message shows it: itself, or escaped when it holds a line break or a control character
    (a message stays one line)."""
    text = str(key)
    return text if text.isprintable() else repr(text)[1:-1]


def nested_model(ann: Any) -> type[BaseModel] | None:
    """The model of a field annotated `SomeModel` or `SomeModel | None`, else None (also for a typed
    sub-config, whose model depends on its `type`: see `variants`)."""
    if variants(ann) or named_model(ann):
        return None
    for candidate in (ann, *typing.get_args(ann)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def named_model(ann: Any) -> type[BaseModel] | None:
    """The model of a field annotated `dict[str, SomeModel]` (entries by name: `tools.servers`), else None."""
    if typing.get_origin(ann) is dict:
        value = typing.get_args(ann)[1]
        if isinstance(value, type) and issubclass(value, BaseModel):
            return value
    return None


def is_source_list(model: type[BaseModel], key: str) -> bool:
    """`rewards.sources`: a list of the reward-source union, whose valid keys depend on each entry's type."""
    return model is RewardsConfig and key == "sources"


def all_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of the tree, sections included; a reward source's as `rewards.sources.N.<key>`,
    for each source type."""
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)  # a dict of named entries (tools.servers) is one key here
        nested = nested_model(field.annotation)
        if nested is not None:
            keys += all_keys(nested, prefix + name + ".")
        for member in variants(field.annotation):
            keys += [k for k in all_keys(member, prefix + name + ".") if k not in keys]
        if is_source_list(model, name):
            for source in SOURCE_TYPES.values():
                keys += all_keys(source, prefix + name + ".N.")
    return keys


def _unknown_key(key: str, model: type[BaseModel], prefix: str, root: type[BaseModel]) -> ConfigError:
    # Compare with this section's names first (a shared prefix would make any nested key look close),
    # then with every dotted key by its last component (a key put in the wrong section).
    guess = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
    if guess:
        hint = f"; did you mean '{prefix + guess[0]}'?"
    else:
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in all_keys(root)}
        leaf = difflib.get_close_matches(key, list(by_leaf), n=1, cutoff=0.8)
        hint = f"; did you mean '{by_leaf[leaf[0]]}'?" if leaf else f"; valid keys here: {sorted(model.model_fields)}"
    return ConfigError(f"unknown config key '{prefix + shown(key)}'{hint}")


def _check_sources(entries: Any, prefix: str) -> None:
    """Each reward source is checked against the settings of its own `type`."""
    if not isinstance(entries, list):
        return
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        kind = entry.get("type")
        if not isinstance(kind, str) or kind not in SOURCE_TYPES:  # a list or mapping is no type, nor hashable
            guess = difflib.get_close_matches(str(kind), list(SOURCE_TYPES), n=1, cutoff=0.6)
            hint = f"; did you mean '{guess[0]}'?" if guess else ""
            raise ConfigError(f"{prefix}{i}.type={kind!r} is not one of {sorted(SOURCE_TYPES)}{hint}")
        fields = SOURCE_TYPES[kind].model_fields
        for key in entry:
            owners = [t for t, model in SOURCE_TYPES.items() if key not in fields and key in model.model_fields]
            if owners:
                raise ConfigError(f"config key '{prefix}{i}.{shown(key)}' is a setting of reward sources of type "
                                  f"{' / '.join(owners)}, not of type {kind}")
        _check_keys(entry, SOURCE_TYPES[kind], f"{prefix}{i}.", Config)


def _check_variant(value: Any, members: list[type[BaseModel]], place: str, root: type[BaseModel]) -> None:
    """A typed sub-config: its `type` picks the member, whose keys are checked; a key of another member
    is named with the type it belongs to. A bare string (the short form) is left to pydantic."""
    if not isinstance(value, dict):
        return
    names = [n for m in members for n in type_names(m)]
    kind = value.get("type")
    member = member_for(members, kind) if kind is not None else None
    if member is None:
        given = "has no type" if kind is None else f"type {kind!r} is not one of them"
        raise ConfigError(f"'{place}' needs a type: {' | '.join(names)}; {given}")
    problem = misplaced(value, members, place)
    if problem:
        raise ConfigError(problem)
    _check_keys(value, member, place + ".", root)


def _check_keys(data: Any, model: type[BaseModel], prefix: str = "", root: type[BaseModel] | None = None) -> None:
    """Reject unknown keys with the nearest valid one, before pydantic sees them. `root` is the whole
    tree, searched for a key put in the wrong section."""
    root = root or model
    if not isinstance(data, dict):
        return
    for key, value in data.items():
        field = model.model_fields.get(str(key))
        # the root names its own old keys (the stage tree's model.default); the RL tree's are algo's
        moved = moved_error(prefix + str(key), getattr(root, "moved_keys", MOVED_KEYS)) if field is None else None
        if moved:
            raise ConfigError(moved)
        if field is None:
            raise _unknown_key(str(key), model, prefix, root)
        dotted = prefix + str(key)
        members = variants(field.annotation)
        if members:
            _check_variant(value, members, dotted, root)
        named = named_model(field.annotation)
        if named is not None and isinstance(value, dict):
            for name, entry in value.items():
                _check_keys(entry, named, f"{dotted}.{shown(name)}.", root)
        nested = nested_model(field.annotation)
        if nested is not None:
            if value is None and field.default is not None:  # a YAML section whose keys are all commented out
                data[key] = value = {}
            _check_keys(value, nested, dotted + ".", root)
        if is_source_list(model, str(key)):
            _check_sources(value, dotted + ".")


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply `a.b.c=value`; the value is parsed as YAML (so 3, 0.5, true, null, [1,2] work)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like dotted.key=value")
    key, _, raw = override.partition("=")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        if node.get(part) is None:
            node[part] = {}
        if isinstance(node[part], str):  # a typed sub-config's short form: algo.advantage=gae, then .lam=0.9
            node[part] = {"type": node[part]}
        node = node[part]
        if not isinstance(node, dict):
            raise ConfigError(f"override {key!r}: '{shown(part)}' is not a section")
    try:
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: the value is not valid YAML ({_yaml_problem(exc)})") from None
    except RecursionError:
        raise ConfigError(f"override {key!r}: the value's collections are nested too deeply to read") from None


def _variant_tags(model: type[BaseModel]) -> dict[str, set[str]]:
    """Field name -> the tags of the typed sub-configs of that name anywhere in `model`'s tree."""
    out: dict[str, set[str]] = {}
    for name, field in model.model_fields.items():
        if variants(field.annotation):
            out.setdefault(name, set()).update(variant_tags(field.annotation))
        for sub in [nested_model(field.annotation), *variants(field.annotation)]:
            for key, tags in (_variant_tags(sub) if sub is not None else {}).items():
                out.setdefault(key, set()).update(tags)
    return out


def _loc(loc: tuple, schema: type[BaseModel] = Config) -> str:
    # A discriminated union adds the member's tag to the location: rewards.sources.0.http.http.url,
    # algo.kl.loss.coef.
    parts, tags = [str(p) for p in loc], _variant_tags(schema)
    out = [p for i, p in enumerate(parts) if not (i > 0 and p in SOURCE_TYPES and parts[i - 1].isdigit())
           and not (i > 0 and p in tags.get(parts[i - 1], ()))]
    return ".".join(map(shown, out)) or "config"


def _problem(err: dict, schema: type[BaseModel] = Config) -> str:
    msg = err["msg"].removeprefix("Value error, ")  # our validators' messages name their keys already
    loc = _loc(err["loc"], schema)
    return msg if loc == "config" or msg.startswith(loc) else f"{loc}: {msg}"


def build_config(data: dict[str, Any], schema: type[BaseModel] = Config) -> Any:
    """`data` checked against `schema` (the RL tree by default; `agentrl.config.stages.StageConfig`)."""
    _check_keys(data, schema)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("invalid config: " + "; ".join(_problem(err, schema) for err in exc.errors())) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + str(getattr(exc, "problem", None) or exc).replace("\n", " ")


def literal_secrets(data: Any, model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted keys of `data` that hold a secret's value itself rather than `env:NAME` / `file:PATH`."""
    if not isinstance(data, dict):
        return []
    found = []
    for key, value in data.items():
        field = model.model_fields.get(str(key))
        if field is None:
            continue
        dotted = prefix + str(key)
        if is_secret(field.annotation) and value is not None and not is_reference(value):
            found.append(dotted)
        nested, named = nested_model(field.annotation), named_model(field.annotation)
        if nested is not None:
            found += literal_secrets(value, nested, dotted + ".")
        if named is not None and isinstance(value, dict):
            for name, entry in value.items():
                found += literal_secrets(entry, named, f"{dotted}.{name}.")
        if is_source_list(model, str(key)) and isinstance(value, list):
            for i, entry in enumerate(value):
                kind = entry.get("type") if isinstance(entry, dict) else None
                if isinstance(kind, str) and kind in SOURCE_TYPES:
                    found += literal_secrets(entry, SOURCE_TYPES[kind], f"{dotted}.{i}.")
    return found


def _read_yaml(path: str | Path, schema: type[BaseModel]) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML at {_yaml_problem(exc)}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ConfigError(f"{path}: collections nested too deeply to read") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    held = literal_secrets(data, schema)
    if held and Path(path).stat().st_mode & 0o077:
        log.warning("%s holds %s itself and other users can read the file: chmod 600 it, or give %s",
                    path, " and ".join(held), HOW_TO_GIVE)
    return data


def load_config(path: str | Path | None, overrides: list[str] = (), schema: type[BaseModel] = Config) -> Any:
    """The config of the YAML file `path` (None: the defaults) with `overrides` applied, validated."""
    data = _read_yaml(path, schema) if path is not None else {}
    on_argv: dict[str, Any] = {}
    for override in overrides:
        apply_override(data, override)
        apply_override(on_argv, override)
    for key in literal_secrets(on_argv, schema):
        raise ConfigError(f"{key} is given on the command line, where every user of this machine reads it (ps); "
                          f"give {key}=env:NAME (an environment variable holding it) or {key}=file:PATH (a file "
                          f"holding it), or put it in the config file")
    return build_config(data, schema)
