"""Reward model: Bradley-Terry on chosen/rejected pairs, saved as a one-output sequence classifier.

    python -m agentrl.rm --config rm.yaml [dotted.key=value ...] [--input_key q --max_len 1024 ...]

Options and data formats: agentrl.stage_cli and agentrl.config.stages.
"""

import sys

from agentrl.stage_cli import main

if __name__ == "__main__":
    sys.exit(main("rm"))
