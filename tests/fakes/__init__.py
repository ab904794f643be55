"""Hand-written test doubles: a scripted fake `claude` and a local Messages API stub."""
