"""The milestone loop: phases and their transitions (phases), the seed's loop (run), the agent
seats (seats), the round in flight and its verdict (ledger), the limits (limits), completion,
recovery, the project's checks, the human's actions, and the one writer of state.json (state)."""
