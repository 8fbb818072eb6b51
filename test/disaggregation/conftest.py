"""PD tests: markers (the server tests are `slow` and `e2e` by module)."""
