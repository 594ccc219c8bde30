"""What every endpoint family shares: the protocol bases, OpenAI's errors, the request's context, the served
model and the fan-in of engine outputs."""
