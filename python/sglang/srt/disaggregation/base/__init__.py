"""What every PD transfer backend implements and what the prefill / decode components rely on:
the KV sender / receiver / manager and bootstrap base classes (`conn.py`, `bootstrap.py`), the
`KVPoll` state machine (`kv_poll.py`) and the backend-neutral messages (`messages.py`).

Nothing here imports a backend (`mooncake/`, `fake/`): a backend is a folder that implements
these classes (disaggregation/README.md); test/unit/test_import_rules.py checks both directions."""
