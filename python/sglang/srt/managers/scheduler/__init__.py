"""The scheduler side of the control plane: one rank's loop (`Scheduler`), its components, its
process entry and sockets (`managers/README.md`). Import from the modules; this package file
imports nothing."""
