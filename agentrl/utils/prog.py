"""How a command line names itself in its usage and errors: `python -m agentrl.train` when run so,
`agentrl train` when run through the `agentrl` script (agentrl.cli sets `SCRIPT` before it runs one)."""

from __future__ import annotations

SCRIPT: str | None = None  # "agentrl" while agentrl.cli runs a command; None under `python -m`


def prog(command: str) -> str:
    """`agentrl <command>` through the script, else `python -m agentrl.<command>`."""
    return f"{SCRIPT} {command}" if SCRIPT else f"python -m agentrl.{command}"
