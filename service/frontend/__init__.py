"""A front-end: the request pipeline (`pipeline`: limits, tokenization, the engine, post-processing), the registry
of models as this process sees them, the engine client (in this process or over the socket) and the HTTP edge
(`http`). `python -m service.frontend` is one front-end process of process mode."""
