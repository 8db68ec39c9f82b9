"""`python -m agentenv.tools.python_sandbox build [--image NAME]`: build the sandbox image if missing."""

from __future__ import annotations

import argparse
import sys

from agentenv.errors import ToolError
from agentenv.tools.python_sandbox.config import PythonSandboxConfig
from agentenv.tools.python_sandbox.image import build_image


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentenv.tools.python_sandbox")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="use the sandbox image if present, else pull one, else build it offline")
    b.add_argument("--image", default=PythonSandboxConfig.image, help="image name (default: %(default)s)")
    b.add_argument("--no-pull", action="store_true", help="skip the pull and build offline with debootstrap")
    args = parser.parse_args(argv)
    cfg = PythonSandboxConfig(image=args.image, pull_image=None if args.no_pull else PythonSandboxConfig.pull_image)
    try:
        build_image(cfg)
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
