"""The scheduler side of the control plane: one rank's loop (`Scheduler`), its components (KV
bookkeeping, schedule policy, watchdog, attention-DP lockstep), its process entry and sockets
(README.md one level up)."""
