"""How many config keys a user can write: the leaf keys of the RL tree (`agentrl.config.Config`) and of
the stage tree (`agentrl.config.stages.StageConfig`), per top-level section.

A leaf is a key that takes a value (a section is not one). A reward source's keys count once per
source type, as `--help` lists them; a typed sub-config (algo.kl) counts the keys of each of its types
once, `type` included, and a sub-config reached twice (algo.kl.controller under both KL types) once.
Also printed: the distinct dotted leaf keys (`algo.kl.coef` once although loss and reward both have
it; `rewards.sources.N.name` once for all source types). Stdlib and agentrl.config only:

    python bench/config_keys.py
"""

from __future__ import annotations

from pydantic import BaseModel

from agentrl.config import Config
from agentrl.config.load import all_keys, is_source_list, nested_model
from agentrl.config.sources import SOURCE_TYPES
from agentrl.config.stages import StageConfig

try:  # typed sub-configs (agentrl.config.algo); older trees have none
    from agentrl.config.variants import variants
except ImportError:  # pragma: no cover - the tree before typed sub-configs
    def variants(ann):  # type: ignore[no-redef]
        return []


def leaves(model: type[BaseModel], seen: set[type] | None = None) -> int:
    """The leaf keys under `model`; `seen`: the sub-config types counted already."""
    seen = set() if seen is None else seen
    n = 0
    for name, field in model.model_fields.items():
        nested, members = nested_model(field.annotation), variants(field.annotation)
        if nested is not None:
            n += leaves(nested, seen)
        elif is_source_list(model, name):
            n += sum(leaves(source, seen) for source in SOURCE_TYPES.values())
        elif members:
            for member in members:
                if member not in seen:
                    seen.add(member)
                    n += leaves(member, seen)
        else:
            n += 1
    return n


def per_section(model: type[BaseModel]) -> dict[str, int]:
    return {name: (leaves(sub) if (sub := nested_model(f.annotation)) is not None else 1)
            for name, f in model.model_fields.items()}


def distinct(model: type[BaseModel]) -> int:
    """Distinct dotted keys that are not sections: no other key starts with `key.`."""
    return len(_leaf_keys(model))


def main() -> None:
    rl, stages = leaves(Config), leaves(StageConfig)
    print(f"RL config (agentrl.config.Config): {rl} keys")
    print("  " + ", ".join(f"{k} {v}" for k, v in per_section(Config).items()))
    print(f"stage config (agentrl.config.stages.StageConfig): {stages} keys")
    print("  " + ", ".join(f"{k} {v}" for k, v in per_section(StageConfig).items()))
    print(f"total: {rl + stages}")
    print(f"distinct dotted leaf keys: RL {distinct(Config)} (algo {sum(k.startswith('algo.') for k in _leaf_keys(Config))}), "
          f"stages {distinct(StageConfig)}")
    algo = Config().algo.model_dump()
    print(f"keys of the default algo section as written out (only the chosen types' keys): {_dumped(algo)}")


def _leaf_keys(model: type[BaseModel]) -> set[str]:
    keys = set(all_keys(model))
    return keys - {k[:i] for k in keys for i, c in enumerate(k) if c == "."}


def _dumped(value: object) -> int:
    """Leaf values of a default config as written out (a typed sub-config: only its type's keys)."""
    if isinstance(value, dict):
        return sum(_dumped(v) for v in value.values())
    return 1


if __name__ == "__main__":
    main()
