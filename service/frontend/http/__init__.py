"""The HTTP edge of a front-end: the app and its state, routes, schemas, the error body, middleware (limits, auth,
admission, metrics), the httptools protocol with its deadlines, the server's sockets, and the docs pages."""
