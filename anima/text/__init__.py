"""Texts the agents get and give: prompts, their budget, reply formats, summaries, redaction."""
