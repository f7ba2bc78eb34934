"""kvsp relay package (see docs/architecture.md)."""
