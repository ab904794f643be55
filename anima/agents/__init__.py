"""The `claude` agent layer: discovery, the stream-json protocol, role profiles, the process.

Nothing is imported here: `anima status` needs only the protocol's pure functions, and the
process layer (ctypes, ptys) would add to its start-up for nothing.
"""
