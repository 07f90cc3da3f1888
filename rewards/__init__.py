"""Reward sources: rule functions, reward-model scorers and HTTP verifiers, all returning
`rewards.base.RewardResult`; reference servers (tools, verifier, code sandbox) under `rewards.servers`.
Nothing is imported here, so a reference server starts without torch."""
