"""The holder: a long-lived asyncio process that keeps handshake-era sessions (and stdio servers) open while
people decide. See `approvals.holder.process`."""
