"""The data-parallel controller process (attention DP): routes requests to the replicas, merges
their replies (README.md one level up)."""
