"""`python -m loadtests --url URL ...`: see loadtests/runner.py."""

from loadtests.runner import main

raise SystemExit(main())
