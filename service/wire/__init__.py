"""What crosses between the front-end and the engine: the socket's frames (`frames`, process mode only), the
request's ticket (`ticket`) and a model's status (`model_status`). Both sides import it; it imports neither."""
