"""The fake transfer backend: the KVPoll state machine without peers or data (conn.py)."""
