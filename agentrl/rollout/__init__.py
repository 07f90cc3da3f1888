"""Rollout: one vLLM engine (`engine`), one episode's token ledger (`episode`), many episodes at once
(`pool`). Knows nothing of DeepSpeed or `agentrl.learner`."""
