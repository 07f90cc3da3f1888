"""`python -m agentrl.models`: prepare a named pretrained model offline (agentrl.models.named)."""

from agentrl.models.named import main
from agentrl.utils.process_exit import run_and_exit

if __name__ == "__main__":
    run_and_exit(main)
