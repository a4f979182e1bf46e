"""``python -m fresh_rl`` — see :mod:`fresh_rl.cli`."""
from fresh_rl.cli import main

if __name__ == "__main__":
    main()
