"""The server layer: the Quart-Trio app and its routes, the HTTP edge (auth, CORS, rate limits, queue
admission), metrics, and the Hypercorn runner with its drain."""
