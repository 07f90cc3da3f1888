"""Direct preference optimisation (sigmoid or IPO loss, label smoothing) against the frozen starting model.

    python -m agentrl.dpo --config dpo.yaml [dotted.key=value ...] [--input_key q --max_len 1024 ...]

Options and data formats: agentrl.stage_cli and agentrl.config.stages.
"""

import sys

from agentrl.stage_cli import main

if __name__ == "__main__":
    sys.exit(main("dpo"))
