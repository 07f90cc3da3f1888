"""The learner: process groups (`dist`), DeepSpeed engines, the critic's value model and the EMA
(`models`), LoRA (`lora`), the RL step (`rl`), weight pushes to the engines (`weight_sync`), and the
supervised stages that make starting checkpoints (`sft`, `reward_training`)."""
