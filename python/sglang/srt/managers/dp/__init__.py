"""The data-parallel controller process (attention DP; `managers/README.md`). Import from the
modules; this package file imports nothing."""
