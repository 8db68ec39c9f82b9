"""`python -m agentenv ...` is the `agentenv` command."""

from agentenv.cli import main

main()
