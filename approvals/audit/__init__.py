"""The audit log.

The core, which services use: ``core`` (the hash chain: ``record``, verification, the chain head,
retention), ``verify`` (the canonical form and hashing, pure Python, also the offline verifier of exports).
The web side, which uses the core: ``views`` and ``urls`` (search, timelines, exports, the chain's state),
``export`` (streamed CSV / JSON Lines). ``tasks`` holds the periodic chain check beat runs.

Nothing is imported here, so ``python -m approvals.audit.verify FILE`` runs without Django.
"""
