"""Asynchronous, off-policy reinforcement learning of language-model agents.

What a user imports sits at the top (`agentrl.env`: Env and AgentEnv; `agentrl.types`: Episode and its
turns); the rest is grouped by job (docs/layout.md, generated from tests/check_layout.py's tiers).

The command lines live in agentrl/commands/ and keep their short names: that folder is on this package's
search path, so `python -m agentrl.train` runs agentrl/commands/train.py as `agentrl.train` (and so do
`agentrl.eval`, `agentrl.serve`, `agentrl.check`, `agentrl.sft`, ...). Nothing imports them as
`agentrl.commands.*` (the layout test says so), so each has exactly one module name."""

import os as _os

__path__.append(_os.path.join(_os.path.dirname(__file__), "commands"))  # noqa: F821 (a package's own __path__)
