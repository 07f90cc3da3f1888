"""Built-in environments, one file each (arithmetic, calculator, guess_number, quiz; code_interpreter and
programming on the code sandbox; humaneval, an eval), and the ecosystem's: reasoning-gym, OpenEnv, verifiers."""
