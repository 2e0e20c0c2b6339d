import sys

from service.engine.server import main

sys.exit(main())
