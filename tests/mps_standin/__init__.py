"""Stand-in for nvidia-cuda-mps-control and helpers to run it in tests (never shipped)."""
