"""``python -m agent``: the node agent's command line (see :mod:`agent.node.cli`)."""
import sys

from agent.node.cli import main

if __name__ == "__main__":
    sys.exit(main())
