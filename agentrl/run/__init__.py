"""One RL run: its owner `RLRun` (`rl_run`), the start-up checks and the building and stopping of engines
and learner ranks (`startup`), the staleness buffer between rollout and learner (`buffer`), connecting to
Ray (`cluster`), and durable checkpoints (`checkpoint`)."""
