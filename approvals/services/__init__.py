"""The write side. One function owns each state change: validate, conditional UPDATE, audit, on_commit."""
