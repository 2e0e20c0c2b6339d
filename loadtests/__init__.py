"""Locust load tests of the bertserve endpoints: `python -m loadtests --url URL ...` (see loadtests/runner.py).

The modules other than `locustfile` do not import Locust (which patches the standard library with gevent on
import), so the runner, the summary maths and the checks can be used and tested in any process.
"""
