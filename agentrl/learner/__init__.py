"""The DeepSpeed side: the RL learner (`rl`), its models, LoRA and weight pushes, and the one loop of the
stages before RL (`stage`, with the stage kinds in `stages`: SFT, reward model, PRM, DPO, KTO)."""
