"""One run in this process: the Accelerator, data loading, the loop, checkpoints and resume,
stop signals, and launching worker processes."""
