"""`python -m queue_service.cli`: the `queue-service` command."""

import sys

from queue_service.cli import main

sys.exit(main())
