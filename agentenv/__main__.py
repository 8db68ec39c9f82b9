"""`python -m agentenv ...` is the `agentenv` command."""

from agentenv.cli import main

if __name__ == "__main__":  # spawned workers (vLLM's engine core) re-import this module: run nothing there
    main()
