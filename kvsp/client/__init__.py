"""KVSP clients: HTTPS with mutual TLS to the Index Service and holders, and the block fetch pipeline."""
