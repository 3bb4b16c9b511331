"""respawn: keep training jobs alive on Spot / preemptible Cloud TPUs and GPUs."""

__version__ = "0.1.0"
