"""`python -m agentcache.cli`: the `agentcache` command."""

import sys

from agentcache.cli import main

sys.exit(main())
