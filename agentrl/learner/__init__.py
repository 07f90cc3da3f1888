"""The learner: process groups (`dist`), DeepSpeed engines, the critic's value model and the EMA
(`models`), LoRA (`lora`), the RL step (`rl`), weight pushes to the engines (`weight_sync`), and the one
loop of the stages before RL (`stage`; the stage kinds SFT, RM, PRM, DPO and KTO in `stages`)."""
