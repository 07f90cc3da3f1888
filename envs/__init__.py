"""Built-in environments, one file each (arithmetic, calculator, guess_number, quiz), and the ecosystem's: reasoning-gym, OpenEnv, verifiers."""
