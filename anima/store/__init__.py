"""What Anima keeps on disk: the record and state models (`models`), their migrations, the
store that reads and writes them atomically (`store`), and the milestone definitions the human
writes (`definitions`, parsed by `milestone_md`)."""
