"""What a run says about itself: metrics.jsonl, the progress bar and the summary (`metrics`), TensorBoard
and wandb (`trackers`), curves.png (`plot`), and the no-learning-signal warning (`learning_signal`)."""
