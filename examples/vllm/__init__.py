"""Two ``vllm serve`` servers sharing one kvsp IS, holder and relay; ``python3 -m examples.vllm`` runs it.

See examples/vllm/README.md and `examples.vllm.__main__`.
"""
