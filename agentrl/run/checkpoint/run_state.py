"""The run's asynchronous state (`RunState`) in `step_N/driver.json`, which checkpoint to resume from,
and the audit that accounts for every task position of a run."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentrl.utils import faults
from agentrl.run.checkpoint.codec import CheckpointError, decode, encode
from agentrl.run.checkpoint.store import ABANDONED, DRIVER_FILE, LEARNER_DIR, MANIFEST, CheckpointStore
from agentrl.types import Group

FORMAT = "agentrl.driver"
FORMAT_VERSION = 1
OLD_PICKLE = "driver.pkl"  # what agentrl wrote before checkpoints held no pickle


class Stateful(Protocol):
    """A component a checkpoint holds: it owns its state and puts it back into a fresh instance."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class RunState:
    """What the driver needs to continue a run exactly where a checkpoint left it: the run's own
    counters and each component's `state_dict()` by name (buffer, producer, pool, stream).

    Every task position below `cursor` is, at the instant the state was taken, exactly one of:
    trained (named in a metrics record before `step`), dropped and counted (likewise), finished and
    waiting in `ready`, or in flight (`in_flight`; an Env's state cannot be saved, so those episodes
    restart from their task on resume)."""

    step: int  # learner batches trained; the resumed run continues at this step
    learner_version: int
    components: dict[str, dict[str, Any]]
    elapsed_s: float  # wall-clock seconds of the run so far (all earlier runs included)
    summary: dict[str, Any] = field(default_factory=dict)  # e.g. eval_before, kept for the final summary
    max_staleness_seen: int = 0
    # Positions dropped (by reason) since the last metrics record and not yet in one: a run stopped by a
    # signal while waiting for a batch; the resumed run writes them into its first record.
    outcomes: dict[str, list[int]] = field(default_factory=dict)

    @property
    def cursor(self) -> int:
        """The next new task stream position."""
        return self.components["producer"]["cursor"]

    @property
    def in_flight(self) -> list[int]:
        """Stream positions of admitted groups not yet finished."""
        return self.components["producer"]["in_flight"]

    @property
    def ready(self) -> list[Group]:
        """Finished groups waiting for the learner, with their version stamps."""
        return self.components["buffer"]["ready"]


def capture(step: int, learner_version: int, components: dict[str, Stateful], elapsed_s: float,
            summary: dict[str, Any], max_staleness_seen: int,
            outcomes: dict[str, list[int]] | None = None) -> RunState:
    """The run's asynchronous state at this instant. Synchronous (no await), so no group can finish,
    and no position move, between the components' states; each copies what it hands over."""
    states = {name: part.state_dict() for name, part in components.items()}
    if "producer" in states and "buffer" in states:
        producer, buffer = len(states["producer"]["in_flight"]), states["buffer"]["in_flight"]
        if producer != buffer:
            raise RuntimeError(f"checkpoint: the producer has {producer} groups in flight, the buffer {buffer}")
    return RunState(step, learner_version, states, elapsed_s, copy.deepcopy(summary), max_staleness_seen,
                    copy.deepcopy(outcomes or {}))


def restore(state: RunState, components: dict[str, Stateful]) -> None:
    """Put `state` back into freshly built components (before the producer runs)."""
    for name, part in components.items():
        part.load_state_dict(state.components[name])


def save_run_state(folder: Path, state: RunState) -> None:
    doc = {"format": FORMAT, "version": FORMAT_VERSION, "step": state.step,
           "learner_version": state.learner_version, "elapsed_s": state.elapsed_s,
           "max_staleness_seen": state.max_staleness_seen, "summary": encode(state.summary),
           "components": encode(state.components), "outcomes": state.outcomes}
    data = json.dumps(doc, ensure_ascii=False).encode()
    with (folder / DRIVER_FILE).open("wb") as f:
        f.write(data[: len(data) // 2])
        faults.fail_point("checkpoint_io")  # an injected write error half-way through the file
        f.write(data[len(data) // 2:])


def load_run_state(folder: str | Path) -> RunState:
    """The RunState of `folder/driver.json`; CheckpointError naming the file when it is not one."""
    path = Path(folder) / DRIVER_FILE
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{folder}: {_missing_driver(Path(folder))}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not a driver state file (JSON expected; nothing in a checkpoint is "
                              f"unpickled): {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an agentrl driver state (no \"format\": \"{FORMAT}\")")
    if doc.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: driver state version {doc.get('version')!r}; this agentrl reads "
                              f"version {FORMAT_VERSION}")
    try:
        return RunState(step=doc["step"], learner_version=doc["learner_version"],
                        components=decode(doc["components"]), elapsed_s=doc["elapsed_s"],
                        summary=decode(doc["summary"]), max_staleness_seen=doc["max_staleness_seen"],
                        outcomes=doc["outcomes"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: malformed driver state ({type(exc).__name__}: {exc})") from None


def _missing_driver(folder: Path) -> str:
    """Why `folder` has no driver state (the caller names the folder)."""
    if (folder / OLD_PICKLE).is_file():
        return (f"the folder holds {OLD_PICKLE}, a pickle written by an older agentrl; checkpoints are no "
                f"longer unpickled (a pickle can run code). Resume it with the agentrl version that wrote it, "
                f"or start a fresh run")
    return (f"not a complete checkpoint folder (one holds {DRIVER_FILE} and {LEARNER_DIR}/; they "
            f"are under <out_dir>/checkpoints/step_N)")


def resolve_resume(resume: str | None, out_dir: str | Path) -> Path | None:
    """The checkpoint folder to resume from: None for a fresh run (`resume` unset, or 'auto' with no
    complete checkpoint in out_dir); a CheckpointError when a named folder is not a complete one.
    Reads the named checkpoint's folder only: nothing there is changed."""
    if resume is None:
        return None
    if resume == "auto":
        store = CheckpointStore(out_dir)
        latest = store.latest()
        if latest is not None:
            check_loadable(latest)
        elif old := sorted(p.parent.name for p in store.root.glob(f"step_*/{OLD_PICKLE}")):
            # not a fresh start: that would empty this out_dir's metrics and write over those checkpoints
            raise CheckpointError(f"train.resume=auto: {store.root} holds only checkpoints of an older agentrl "
                                  f"({', '.join(old)}: {OLD_PICKLE}, a pickle), which are no longer loaded (a "
                                  f"pickle can run code); resume them with that version, or use another out_dir")
        return latest
    folder = Path(resume).expanduser()
    if not (folder / DRIVER_FILE).is_file() or not (folder / LEARNER_DIR).is_dir():
        raise CheckpointError(f"train.resume={resume!r}: {_missing_driver(folder)}")
    store = CheckpointStore(folder.parent.parent)
    # one set aside by a rollback was complete when it moved (only complete ones move), and has no row
    set_aside = folder.parent.name.startswith(ABANDONED) and folder.parent.parent.name == "checkpoints"
    if not set_aside and folder.resolve() not in [p.resolve() for p in store.complete()]:
        raise CheckpointError(f"train.resume={resume!r}: this checkpoint has no row in "
                              f"{folder.parent / MANIFEST}; it was cut off mid-write")
    check_loadable(folder)
    return folder


def check_loadable(folder: Path) -> None:
    """CheckpointError naming the file when loading `folder` would fail or would have to unpickle
    something: its driver state parsed, its learner files scanned (nothing in them is run)."""
    from agentrl.learner.state import CheckpointFileError, check_files

    load_run_state(folder)
    try:
        check_files(folder / LEARNER_DIR)
    except CheckpointFileError as exc:
        raise CheckpointError(str(exc)) from None


def audit(out_dir: str | Path) -> dict[str, Any]:
    """Account for every task position of a finished (or stopped) run from its metrics records and
    its newest checkpoint: each position below the checkpoint's cursor should appear exactly once,
    as trained, dropped (by reason), or waiting/in flight in that checkpoint."""
    from agentrl.telemetry.metrics import read_metrics

    out_dir = Path(out_dir)
    latest = CheckpointStore(out_dir).latest()
    if latest is None:
        raise FileNotFoundError(f"{out_dir}: no complete checkpoint to audit against")
    state = load_run_state(latest)
    records = [r for r in read_metrics(out_dir / "metrics.jsonl") if r["step"] < state.step]
    trained = [p for r in records for p in r.get("tasks/trained", [])]
    dropped = [p for r in records for ids in r.get("tasks/dropped", {}).values() for p in ids]
    dropped += [p for ids in state.outcomes.values() for p in ids]
    pending = [g.group_id for g in state.ready] + list(state.in_flight)
    seen: dict[int, int] = {}
    for p in trained + dropped + pending:
        seen[p] = seen.get(p, 0) + 1
    steps = [r["step"] for r in records]
    return {
        "checkpoint": str(latest), "steps": steps, "cursor": state.cursor,
        "trained": len(trained), "dropped": len(dropped), "pending": len(pending),
        "skipped": [p for p in range(state.cursor) if p not in seen],
        "duplicated": sorted(p for p, n in seen.items() if n > 1),
        "steps_missing": sorted(set(range(state.step)) - set(steps)),
        "steps_repeated": sorted(s for s in set(steps) if steps.count(s) > 1),
        "max_trained_staleness": max((r["trained_staleness_max"] for r in records), default=0),
    }
