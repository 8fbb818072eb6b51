"""Inputs of the upstream frontend programs, shared by `upstream_programs.py` (run by upstream's
client) and `test_upstream_frontend.py` (which checks the answers); imports nothing of sglang."""

QUESTIONS = ["What is 1+1?", "What is the capital of Spain?", "What color is the sky?", "Name a fruit."]
SELECT_PROMPT = "The capital of France is"
# The second list's answer depends on the normalisation: by mean logprob (upstream's default,
# token_length_normalized) the long choice wins, by sum it would lose.
SELECT_CHOICES = (
    [" Paris", " London", " Berlin, the capital of Germany"],
    [" London", " Berlin, the capital of Germany"],
)
FORK_PROMPT = "Here are two tips for staying healthy: 1. Balanced Diet. 2. Regular Exercise.\n\n"

# constrained decoding through the frontend language (`sgl.gen(regex=...)`, `json_schema=...`)
CONSTRAINED_PROMPT = "Q: Is the sky blue, and how old is the sun in billions of years?\nA:"
CONSTRAINED_REGEX = r" (yes|no), [0-9]{1,2}"
CONSTRAINED_SCHEMA = (
    '{"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}'
)
