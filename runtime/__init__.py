"""Runtime package."""
