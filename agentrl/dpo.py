"""Direct preference optimisation (sigmoid or IPO loss, label smoothing) against the frozen starting model.

    python -m agentrl.dpo --config dpo.yaml [dotted.key=value ...] [--input_key q --max_len 1024 ...]

Options and data formats: agentrl.stage_cli and agentrl.config.stages.
"""


from agentrl.stage_cli import main
from agentrl.utils.process_exit import run_and_exit

if __name__ == "__main__":
    run_and_exit(main, "dpo")
