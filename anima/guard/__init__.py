"""What an agent may not change: main, the human's definitions, Anima's records and its own
queue of work. Confined agents cannot write them, and `TurnGuard` (`turns`) only watches main;
unconfined ones can, and `RestoringGuard` (`restore`) puts back what they changed."""
