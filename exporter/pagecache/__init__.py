"""Page-cache residency of model weight files (mmap + mincore), sampled on a slow interval."""
