"""Resumable checkpoints: `<out_dir>/checkpoints/step_N/`, written atomically, found by a manifest,
holding no pickle.

    step_N/learner/       the learner's state (`Learner.save_checkpoint`, files in `agentrl.learner.state`):
                          DeepSpeed engines with their optimizer and scheduler (loaded with
                          `torch.load(weights_only=True)`), and learner_state.json + .safetensors (EMA,
                          KL controller, reward normaliser, version, RNG)
    step_N/driver.json    the run's asynchronous state (`RunState`, JSON through `codec`): each
                          component's own state dict (buffer: finished groups not yet trained; producer:
                          task cursor and positions in flight; pool: counters; stream), the step, the clock

    store.py       CheckpointStore: atomic writes, the manifest, pruning, rollback (moves aside, never deletes)
    run_state.py   RunState, capture/restore, driver.json, which checkpoint to resume from, the audit
    codec.py       the JSON codec of driver.json (an allow-list of classes; no pickle)
    preempt.py     SIGTERM / SIGINT as a request to stop at the run's next safe point, with a checkpoint

Loading a checkpoint never runs code from it; a resume never changes anything outside the resumed
run's own out_dir (a checkpoint of another run is only read).
"""

from agentrl.run.checkpoint.codec import CheckpointError
from agentrl.run.checkpoint.run_state import (RunState, Stateful, audit, capture, load_run_state, restore, resolve_resume,
                                          save_run_state)
from agentrl.run.checkpoint.store import (DRIVER_FILE, LEARNER_DIR, MANIFEST, CheckpointStore, CheckpointWriteError)

__all__ = ["CheckpointError", "CheckpointStore", "CheckpointWriteError", "DRIVER_FILE", "LEARNER_DIR", "MANIFEST",
           "RunState", "Stateful", "audit", "capture", "load_run_state", "restore", "resolve_resume", "save_run_state"]
