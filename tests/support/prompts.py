"""Short prompts shared by the engine tests (sync and async)."""
PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "In 1492, Columbus",
    "Water boils at",
    "The quick brown fox jumps over the lazy dog because",
    "My favourite recipe for soup",
    "1, 2, 3, 4,",
]
