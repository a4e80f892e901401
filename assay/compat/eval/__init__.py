"""lm-eval tasks for `--eval`: which tasks (embedded or the user's files), scoring them item by item, and the verdict against the reference."""
