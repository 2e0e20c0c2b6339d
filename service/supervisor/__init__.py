"""Process mode's supervisor (`launcher`): starts the engine and the front-ends, watches their heartbeats, restarts
what dies or sticks. It starts them as programs (`python -m service.engine`, `python -m service.frontend`) and
imports neither."""
