"""Supervised fine-tuning on prompt/response pairs or conversations (loss on assistant turns; --packing).

    python -m agentrl.sft --config sft.yaml [dotted.key=value ...] [--input_key q --max_len 1024 ...]

Options and data formats: agentrl.stage_cli and agentrl.config.stages.
"""

import sys

from agentrl.stage_cli import main

if __name__ == "__main__":
    sys.exit(main("sft"))
