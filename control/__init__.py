"""kvsp control package (see docs/architecture.md)."""
