"""Asynchronous, off-policy reinforcement learning of language-model agents.

What a user imports and what a user runs sit at the top: `agentrl.env` (Env and AgentEnv), `agentrl.types`
(Episode and its turns), and one module per command line (`agentrl.train`, `agentrl.eval`, `agentrl.serve`,
`agentrl.check`, the stages `agentrl.sft`, ...), each run as `python -m agentrl.<name>` or
`agentrl <name>` (the `agentrl` script: `agentrl.cli`). The rest is grouped by job (docs/layout.md,
generated from tests/check_layout.py's tiers)."""
