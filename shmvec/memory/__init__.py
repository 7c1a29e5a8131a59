"""The shared memory between the main process and its workers: the ring, the layout of its arrays,
typed info columns and the doorbell."""
