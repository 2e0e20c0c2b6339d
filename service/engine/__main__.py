from service.engine.server import main
from service.system.exit import exit_now

exit_now(main())
